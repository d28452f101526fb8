// The collective sweep over the mpi backend, on real MPI processes: ctest
// starts this binary under `mpirun -np N` (N = 2, 3, 4). Every rank runs
// allreduce, reduce, broadcast, allgather and reduce_scatter over counts
// {0, 1, 7, 1000, 1048579} x every dtype x every op (ops only where the
// collective reduces), varying the root, and checks its result element by
// element against the reference (collective_cases.h).
#include <gtest/gtest.h>

#include "comm/block_cases.h"
#include "comm/collective_cases.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

using testing::kSweepCounts;
using testing::run_collective_case;

bool takes_op(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter;
}
bool takes_root(Collective c) { return c == Collective::reduce || c == Collective::broadcast; }

class MpiSweep : public ::testing::TestWithParam<Collective> {
 protected:
  // One world for the whole binary: forming it is a bootstrap through MPI
  // plus a communicator; the cases themselves are what this test is about.
  static void SetUpTestSuite() {
    GroupOptions options;
    options.backend = "mpi";
    world_ = init_process_group(options);
  }
  static void TearDownTestSuite() { world_.reset(); }
  static std::shared_ptr<ProcessGroup> world_;
};
std::shared_ptr<ProcessGroup> MpiSweep::world_;

TEST_P(MpiSweep, EveryCountDTypeAndOp) {
  ProcessGroup& pg = *world_;
  ASSERT_EQ(pg.backend(), "mpi");
  const Collective c = GetParam();
  // Every rank runs every case, whatever happens on the others: a rank that
  // stopped at its first wrong result would leave the others waiting.
  std::vector<std::string> failures;
  int cases = 0;
  for (std::size_t count : kSweepCounts) {
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!takes_op(c) && op != ReduceOp::sum) continue;
        const int root = takes_root(c) ? cases % pg.size() : 0;
        ++cases;
        std::string failure = run_collective_case(pg, c, count, dtype, op, root);
        if (!failure.empty()) failures.push_back(std::move(failure));
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << cases << " cases failed; first: " << failures.front();
  EXPECT_FALSE(pg.aborted());
}

INSTANTIATE_TEST_SUITE_P(Collectives, MpiSweep,
                         ::testing::Values(Collective::allreduce, Collective::reduce, Collective::broadcast,
                                           Collective::allgather, Collective::reduce_scatter),
                         [](const auto& info) { return std::string(to_string(info.param)); });

class MpiBlockSweep : public MpiSweep {};

TEST_F(MpiBlockSweep, EveryBlockCollectiveCountAndDType) {
  ProcessGroup& pg = *world_;
  std::vector<std::string> failures;
  int cases = 0;
  for (testing::BlockCase c : testing::kAllBlockCases) {
    for (std::size_t count : kSweepCounts) {
      for (DType dtype : kAllDTypes) {
        std::string failure = testing::run_block_case(pg, c, count, dtype, cases++ % pg.size());
        if (!failure.empty()) failures.push_back(std::move(failure));
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << cases << " cases failed; first: " << failures.front();
  EXPECT_FALSE(pg.aborted());
}

TEST_F(MpiBlockSweep, PremulSumOfEveryReduction) {
  ProcessGroup& pg = *world_;
  std::vector<std::string> failures;
  int cases = 0;
  for (Collective c : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter}) {
    for (std::size_t count : kSweepCounts) {
      for (DType dtype : kAllDTypes) {
        if (!is_floating(dtype)) continue;
        std::string failure = testing::run_premul_case(pg, c, count, dtype, cases++ % pg.size());
        if (!failure.empty()) failures.push_back(std::move(failure));
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << cases << " cases failed; first: " << failures.front();
}

}  // namespace
}  // namespace lockstep
