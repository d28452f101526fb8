// Where a collective case's buffers live while the collective runs. The
// cases (collective_cases.h, block_cases.h) build their inputs and check
// their results in host vectors; a Placement hands the collective a buffer
// over each vector (the vector itself, or a copy of it in CUDA memory) and,
// once the collective is done, brings the results back into the vectors.
// Not thread-safe: one per rank.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::testing {

class Placement {
 public:
  virtual ~Placement() = default;
  // The collective's view of `count` elements at the start of `host`,
  // which receives the result in finish().
  virtual Buffer place(std::vector<std::byte>& host, std::size_t count, DType dtype) = 0;
  // The same for an input, which is not brought back.
  virtual ConstBuffer place_input(const std::vector<std::byte>& host, std::size_t count, DType dtype) = 0;
  // Waits for the collective and brings every placed buffer back.
  virtual void finish(Work& work) = 0;
};

// The vectors themselves.
class HostPlacement final : public Placement {
 public:
  Buffer place(std::vector<std::byte>& host, std::size_t count, DType dtype) override {
    return Buffer{count > 0 ? host.data() : nullptr, count, dtype};
  }
  ConstBuffer place_input(const std::vector<std::byte>& host, std::size_t count, DType dtype) override {
    return ConstBuffer{count > 0 ? host.data() : nullptr, count, dtype};
  }
  void finish(Work& work) override { work.wait(); }
};

}  // namespace lockstep::testing
