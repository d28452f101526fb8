// One collective case as every rank runs it: build this rank's input, run
// the collective, check the result element by element against the
// reference. Shared by the thread-rank sweep and the forked-rank tests.
// Thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "lockstep/process_group.h"
#include "placement.h"
#include "reference.h"

namespace lockstep::testing {

// The counts every sweep covers: empty, one, odd, medium, large and odd.
inline constexpr std::size_t kSweepCounts[] = {0, 1, 7, 1000, 1048579};

// Returns "" if this rank's result is right, else what is wrong. The
// collective's buffers are where `at` puts them (host memory by default).
inline std::string run_collective_case(ProcessGroup& pg, Collective c, std::size_t count, DType dtype, ReduceOp op,
                                       int root, Placement&& at = HostPlacement()) {
  const int n = pg.size();
  const int r = pg.rank();
  const std::size_t elem = dtype_size(dtype);
  std::vector<std::byte> want;
  std::vector<std::byte> got;
  std::size_t check_count = count;
  switch (c) {
    case Collective::allreduce: {
      got = make_input(r, count, dtype, op);
      at.finish(*pg.allreduce(at.place(got, count, dtype), op));
      want = expected_results(dtype, count, 0, n, op);
      break;
    }
    case Collective::reduce: {
      got = make_input(r, count, dtype, op);
      at.finish(*pg.reduce(at.place(got, count, dtype), root, op));
      if (r == root) {
        want = expected_results(dtype, count, 0, n, op);
      } else {
        want = make_input(r, count, dtype, op);  // non-roots keep their input
      }
      break;
    }
    case Collective::broadcast: {
      got = make_input(r, count, dtype, op);
      at.finish(*pg.broadcast(at.place(got, count, dtype), root));
      want = make_input(root, count, dtype, op);
      break;
    }
    case Collective::allgather: {
      auto input = make_input(r, count, dtype, op);
      got.assign(count * static_cast<std::size_t>(n) * elem + 1, std::byte{0x5a});
      at.finish(*pg.allgather(at.place_input(input, count, dtype),
                              at.place(got, count * static_cast<std::size_t>(n), dtype)));
      want.resize(got.size());
      for (int q = 0; q < n; ++q) {
        auto block = make_input(q, count, dtype, op);
        std::copy(block.begin(), block.begin() + static_cast<std::ptrdiff_t>(count * elem),
                  want.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(q) * count * elem));
      }
      check_count = count * static_cast<std::size_t>(n);
      break;
    }
    case Collective::reduce_scatter: {
      const std::size_t total = count * static_cast<std::size_t>(n);
      auto input = make_input(r, total, dtype, op);
      got.assign(count * elem + 1, std::byte{0x5a});
      at.finish(*pg.reduce_scatter(at.place_input(input, total, dtype), at.place(got, count, dtype), op));
      want = expected_results(dtype, count, static_cast<std::size_t>(r) * count, n, op);
      break;
    }
    default:
      return "not a swept collective";
  }
  std::string diff = compare_elements(got.data(), want.data(), check_count, dtype);
  if (diff.empty()) return "";
  return fmt::format("rank {}/{}: {} of {} x {} op {} root {}: {}", r, n, c, dtype, count, op, root, diff);
}

}  // namespace lockstep::testing
