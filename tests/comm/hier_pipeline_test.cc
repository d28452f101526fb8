// hier's pipelined allreduce (src/comm/hier/allreduce.cc): buffers large
// enough to be cut into pieces give exactly the sums, averages and 16-bit
// results of the unpipelined algorithm, with the last piece padded; a rank
// that never joins fails the others with a timeout, raised on the worker
// thread and carried to the caller. The same for the pipelined allgather
// and reduce_scatter (allgather.cc, reduce_scatter.cc), on hosts whose
// ranks are not consecutive. And the OrderedWorker it runs on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/hier/ordered_worker.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::ThreadWorld;

TEST(OrderedWorker, RunsJobsInOrderOnOneOtherThread) {
  std::vector<int> order;
  std::thread::id worker_thread;
  {
    OrderedWorker worker;
    for (int i = 0; i < 5; ++i)
      worker.submit([&, i] {
        if (i == 0) worker_thread = std::this_thread::get_id();
        EXPECT_EQ(std::this_thread::get_id(), worker_thread);
        order.push_back(i);
      });
    worker.wait(4, nullptr);
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(worker_thread, std::this_thread::get_id());
}

TEST(OrderedWorker, AFailureIsRethrownAndLaterJobsAreSkipped) {
  OrderedWorker worker;
  bool later_ran = false;
  worker.submit([] {});
  worker.submit([] { throw std::runtime_error("piece 1 failed"); });
  worker.submit([&] { later_ran = true; });
  worker.wait(0, nullptr);
  EXPECT_THROW(worker.wait(2, nullptr), std::runtime_error);
  EXPECT_FALSE(later_ran);
}

TEST(OrderedWorker, TheOwnersCancelReachesARunningJob) {
  OrderedWorker worker;
  std::atomic<bool> owner_cancel{false};
  const std::atomic<bool>* flag = worker.cancel_flag();
  worker.submit([flag] {
    while (!flag->load()) std::this_thread::sleep_for(1ms);
    throw std::runtime_error("cancelled");
  });
  std::thread canceller([&] {
    std::this_thread::sleep_for(20ms);
    owner_cancel.store(true);
  });
  EXPECT_THROW(worker.wait(0, &owner_cancel), std::runtime_error);
  canceller.join();
}

// 4 ranks as 2 pretend hosts of 2; counts above 2 x 4 MiB so the allreduce
// is cut into pieces, odd so that the last piece is padded.
class HierPipeline : public ::testing::Test {
 protected:
  ThreadWorld world_{4, "hier", 60s, {}, testing::pretend_hosts({2, 2})};
};

TEST_F(HierPipeline, SumAndAverageAreExactAcrossPieces) {
  constexpr std::size_t kCount = (std::size_t{3} << 20) + 3;  // 12 MiB of floats: 3 pieces
  world_.run([&](int rank, ProcessGroup& pg) {
    std::vector<float> sum(kCount), avg(kCount);
    for (std::size_t i = 0; i < kCount; ++i) sum[i] = avg[i] = static_cast<float>(i % 1000) + static_cast<float>(rank);
    pg.allreduce(view(std::span(sum)))->wait();
    pg.allreduce(view(std::span(avg)), ReduceOp::avg)->wait();
    for (std::size_t i = 0; i < kCount; ++i) {
      const float x = static_cast<float>(i % 1000);
      ASSERT_EQ(sum[i], 4 * x + 6) << "element " << i;
      ASSERT_EQ(avg[i], x + 1.5f) << "element " << i;
    }
  });
}

TEST_F(HierPipeline, SixteenBitTypesAreReducedInFp32AndRoundedOnce) {
  constexpr std::size_t kCount = (std::size_t{5} << 20) + 1;  // 10 MiB of bf16: 2 pieces
  world_.run([&](int rank, ProcessGroup& pg) {
    // Three ranks give 64.5, one 64: 257.5 in fp32, rounded once to bf16
    // 258. Rounding each host's partial sum (129, 128.5 -> 128) would give
    // 257, which rounds to 256.
    std::vector<std::uint16_t> v(kCount, 0x4281);  // bf16 64.5
    if (rank == 3) std::fill(v.begin(), v.end(), std::uint16_t{0x4280});  // 64.0
    pg.allreduce(Buffer{v.data(), kCount, DType::bf16})->wait();
    for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(v[i], 0x4381) << "element " << i;  // bf16 258
  });
}

TEST(HierPipelineFailure, ARankThatNeverJoinsIsATimeoutOnTheOthers) {
  constexpr std::size_t kCount = std::size_t{4} << 20;  // 16 MiB of floats
  ThreadWorld world(4, "hier", 3s, {}, testing::pretend_hosts({2, 2}));
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    if (rank == 3) return;
    std::vector<float> v(kCount, 1.0f);
    pg.allreduce(view(std::span(v)))->wait();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), Error) << "rank " << r;
  }
}

// 6 ranks on 3 pretend hosts of 2, ranks not in host order (local rank 1
// of host 0 is rank 4), so the blocks must be put back in rank order.
class HierPipelineShuffled : public ::testing::Test {
 protected:
  ThreadWorld world_{6, "hier", 60s, {}, {"host0", "host1", "host2", "host1", "host0", "host2"}};
};

TEST_F(HierPipelineShuffled, AllgatherPutsEveryPieceOfEveryBlockInRankOrder) {
  constexpr std::size_t kCount = (std::size_t{1} << 20) + 7;  // 6 x 4 MiB of output: 6 pieces, uneven
  world_.run([&](int rank, ProcessGroup& pg) {
    std::vector<float> in(kCount), out(6 * kCount, -1.0f);
    for (std::size_t i = 0; i < kCount; ++i) in[i] = static_cast<float>(rank * 1000 + i % 997);
    pg.allgather(view(std::span(in)), view(std::span(out)))->wait();
    for (std::size_t r = 0; r < 6; ++r)
      for (std::size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(out[r * kCount + i], static_cast<float>(r * 1000 + i % 997)) << "block " << r << " element " << i;
  });
}

TEST_F(HierPipelineShuffled, ReduceScatterLeavesEachRankItsOwnBlockSummedAndAveraged) {
  constexpr std::size_t kCount = (std::size_t{1} << 19) + 5;  // 6 x 2 MiB of input: 3 pieces, uneven
  world_.run([&](int rank, ProcessGroup& pg) {
    // Block b of rank r holds b * 100 + r + i % 7: block b sums to
    // 6 (b * 100 + i % 7) + 15 over the ranks.
    std::vector<float> in(6 * kCount), sum(kCount), avg(kCount);
    for (std::size_t b = 0; b < 6; ++b)
      for (std::size_t i = 0; i < kCount; ++i)
        in[b * kCount + i] = static_cast<float>(b * 100 + static_cast<std::size_t>(rank) + i % 7);
    pg.reduce_scatter(view(std::span(in)), view(std::span(sum)))->wait();
    pg.reduce_scatter(view(std::span(in)), view(std::span(avg)), ReduceOp::avg)->wait();
    const auto b = static_cast<std::size_t>(rank);
    for (std::size_t i = 0; i < kCount; ++i) {
      const float expected = static_cast<float>(6 * (b * 100 + i % 7) + 15);
      ASSERT_EQ(sum[i], expected) << "element " << i;
      ASSERT_EQ(avg[i], expected / 6) << "element " << i;
    }
  });
}

TEST(HierPipelineFailure, ARankThatNeverJoinsAPipelinedAllgatherOrReduceScatterIsAnErrorOnTheOthers) {
  constexpr std::size_t kCount = std::size_t{4} << 20;  // 16 MiB of floats per rank
  for (const bool gather : {true, false}) {
    ThreadWorld world(4, "hier", 3s, {}, testing::pretend_hosts({2, 2}));
    const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
      if (rank == 3) return;
      std::vector<float> block(kCount, 1.0f), all(4 * kCount, 1.0f);
      if (gather)
        pg.allgather(view(std::span(block)), view(std::span(all)))->wait();
      else
        pg.reduce_scatter(view(std::span(all)), view(std::span(block)))->wait();
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << (gather ? "allgather" : "reduce_scatter") << ", rank " << r;
      EXPECT_THROW(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), Error) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace lockstep
