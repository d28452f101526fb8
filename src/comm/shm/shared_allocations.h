// Buffers from ProcessGroup::allocate_shared on the shm backend: allocation
// `id` exists once per rank, and every rank maps all of them, so rank q's
// copy of any byte is at bases(id)[q] + offset. Collectives look up whether
// a buffer lies inside one (to read peers' copies in place).
// Thread-safe: allocations are added and removed on user threads and looked
// up on the progress thread, under one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/shm/region.h"

namespace lockstep::shm {

class SharedAllocations {
 public:
  struct Location {
    std::uint64_t id = 0;
    std::size_t offset = 0;
  };

  void add(std::uint64_t id, std::size_t bytes, int self, std::vector<Region> regions);
  void remove(std::uint64_t id);

  // The allocation holding [p, p + bytes) in this rank's copies, if any.
  std::optional<Location> find(const void* p, std::size_t bytes) const;
  // Every rank's base address of allocation `id` (empty if unknown).
  std::vector<std::byte*> bases(std::uint64_t id) const;

 private:
  struct Allocation {
    std::size_t bytes = 0;
    std::byte* own = nullptr;
    std::vector<Region> regions;  // one per rank, own included
  };
  mutable std::mutex mutex_;
  std::map<std::uint64_t, Allocation> allocations_;
};

}  // namespace lockstep::shm
