// The collective sweep as a rank program for the emulated cluster: started
// by `lockstep run` on every host (or by mpirun for the mpi backend), it
// joins the group of the backend LOCKSTEP_BACKEND names, and runs
//   1. allreduce, reduce, broadcast, allgather and reduce_scatter over a
//      few counts x every dtype x every op (ops only where the collective
//      reduces), the root varying, then the block collectives (gather,
//      scatter, all_to_all, uneven all_to_all and allgather), and
//   2. the same on a sub-group of every rank but rank 0 (it spans the hosts
//      whenever the world does and, with two ranks per host, has one rank on
//      the first host and two on the second),
// checking each result element by element against the reference. Prints
// "cluster sweep: world W backend B: C cases, F failed" per group and exits
// 1 if any case failed. Counts stay small: across emulated links the point
// is the cross-host paths, which the thread and mpi sweeps cover in depth.
// Single-threaded.
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "comm/block_cases.h"
#include "comm/collective_cases.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"

namespace {

using lockstep::Collective;
using lockstep::DType;
using lockstep::ProcessGroup;
using lockstep::ReduceOp;

constexpr std::size_t kCounts[] = {0, 1, 7, 1000, 65539};

bool takes_op(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter;
}
bool takes_root(Collective c) { return c == Collective::reduce || c == Collective::broadcast; }

// Every rank runs every case, whatever happens on the others: a rank that
// stopped at its first wrong result would leave the others waiting.
int sweep(ProcessGroup& pg, const char* label) {
  std::vector<std::string> failures;
  int cases = 0;
  for (Collective c : {Collective::allreduce, Collective::reduce, Collective::broadcast, Collective::allgather,
                       Collective::reduce_scatter}) {
    for (std::size_t count : kCounts) {
      for (DType dtype : lockstep::kAllDTypes) {
        for (ReduceOp op : lockstep::kAllReduceOps) {
          if (!takes_op(c) && op != ReduceOp::sum) continue;
          const int root = takes_root(c) ? cases % pg.size() : 0;
          ++cases;
          std::string failure = lockstep::testing::run_collective_case(pg, c, count, dtype, op, root);
          if (!failure.empty()) failures.push_back(std::move(failure));
        }
      }
    }
  }
  for (lockstep::testing::BlockCase c : lockstep::testing::kAllBlockCases) {
    for (std::size_t count : kCounts) {
      for (DType dtype : {DType::f32, DType::f64, DType::u8}) {
        std::string failure = lockstep::testing::run_block_case(pg, c, count, dtype, cases++ % pg.size());
        if (!failure.empty()) failures.push_back(std::move(failure));
      }
    }
  }
  pg.barrier()->wait();
  std::printf("cluster sweep: %s of %d ranks, backend %s: %d cases, %zu failed%s%s\n", label, pg.size(),
              std::string(pg.backend()).c_str(), cases, failures.size(), failures.empty() ? "" : "; first: ",
              failures.empty() ? "" : failures.front().c_str());
  std::fflush(stdout);
  return failures.empty() ? 0 : 1;
}

}  // namespace

int main() {
  try {
    auto world = lockstep::init_process_group();
    int rc = sweep(*world, "world");
    if (world->size() > 2) {
      std::vector<int> members(static_cast<std::size_t>(world->size() - 1));
      std::iota(members.begin(), members.end(), 1);
      if (world->rank() != 0) rc |= sweep(*world->new_group(members), "sub-group 1..n-1");
      world->barrier()->wait();
    }
    return rc;
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "cluster sweep: %s\n", e.what());
    return 2;
  }
}
