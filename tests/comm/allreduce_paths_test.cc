// The shm backend's choice between the slots and single copy for ordinary
// buffers (src/comm/shm/allreduce_paths.h): each way measured before it is
// trusted, the cheaper per byte within a size class, refreshed on a
// schedule every rank shares, and a majority of the ranks' votes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/shm/allreduce_paths.h"

namespace lockstep::shm {
namespace {

using Path = AllreducePaths::Path;
constexpr std::size_t kMiB = 1 << 20;

TEST(AllreducePaths, EachWayIsMeasuredBeforeEitherIsPreferred) {
  AllreducePaths paths;
  EXPECT_EQ(paths.vote(16 * kMiB), Path::slots);
  paths.record(Path::slots, 16 * kMiB, 2'000'000);
  EXPECT_EQ(paths.vote(16 * kMiB), Path::single_copy);
  paths.record(Path::single_copy, 16 * kMiB, 3'000'000);
  EXPECT_EQ(paths.vote(16 * kMiB), Path::slots);
}

TEST(AllreducePaths, TheCheaperWayPerBytePerSizeClassWins) {
  AllreducePaths paths;
  paths.record(Path::slots, 16 * kMiB, 2'000'000);
  paths.record(Path::single_copy, 16 * kMiB, 1'000'000);
  paths.record(Path::slots, 1 * kMiB, 100'000);
  paths.record(Path::single_copy, 1 * kMiB, 200'000);
  EXPECT_EQ(paths.vote(16 * kMiB), Path::single_copy);
  EXPECT_EQ(paths.vote(20 * kMiB), Path::single_copy) << "within a factor of 4: the same class";
  EXPECT_EQ(paths.vote(1 * kMiB), Path::slots);
  EXPECT_EQ(paths.vote(256 * kMiB), Path::slots) << "a class never measured: the slots first";
  EXPECT_EQ(AllreducePaths::size_class(16 * kMiB), AllreducePaths::size_class(63 * kMiB));
  EXPECT_NE(AllreducePaths::size_class(16 * kMiB), AllreducePaths::size_class(64 * kMiB));
}

// A machine that gets busy: the slots' cost rises measurement by
// measurement until single copy is cheaper, and falls back when it is quiet.
TEST(AllreducePaths, ALoadThatComesAndGoesMovesTheVote) {
  AllreducePaths paths;
  paths.record(Path::slots, 16 * kMiB, 2'000'000);
  paths.record(Path::single_copy, 16 * kMiB, 3'000'000);
  int busy_measurements = 0;
  while (paths.vote(16 * kMiB) == Path::slots && busy_measurements < 20) {
    paths.record(Path::slots, 16 * kMiB, 16'000'000);
    ++busy_measurements;
  }
  EXPECT_EQ(paths.vote(16 * kMiB), Path::single_copy);
  EXPECT_LE(busy_measurements, 2) << "a load that makes the slots 8x slower shows within two operations";
  int quiet_measurements = 0;
  while (paths.vote(16 * kMiB) == Path::single_copy && quiet_measurements < 20) {
    paths.record(Path::slots, 16 * kMiB, 2'000'000);  // a refresh through the slots
    ++quiet_measurements;
  }
  EXPECT_EQ(paths.vote(16 * kMiB), Path::slots);
  EXPECT_LE(quiet_measurements, 5);
}

TEST(AllreducePaths, RefreshesTakeEachWayOnceEveryPeriodByTheOperationCount) {
  int slots = 0, single = 0;
  for (std::uint64_t n = 0; n < 10 * AllreducePaths::kRefreshEvery; ++n) {
    const auto forced = AllreducePaths::forced(n);
    if (!forced) continue;
    (*forced == Path::slots ? slots : single) += 1;
  }
  EXPECT_EQ(slots, 10);
  EXPECT_EQ(single, 10);
  EXPECT_FALSE(AllreducePaths::forced(0)) << "the first operations vote (each way measured first)";
}

TEST(AllreducePaths, SingleCopyNeedsMoreThanHalfTheVotes) {
  const std::vector<std::int64_t> half = {0, 1, 1, 0}, most = {1, 1, 0, 1}, one = {1}, none = {0, 0};
  EXPECT_EQ(AllreducePaths::decide(half.data(), 4), Path::slots);
  EXPECT_EQ(AllreducePaths::decide(most.data(), 4), Path::single_copy);
  EXPECT_EQ(AllreducePaths::decide(one.data(), 1), Path::single_copy);
  EXPECT_EQ(AllreducePaths::decide(none.data(), 2), Path::slots);
  const std::vector<std::int64_t> garbage = {7, -3, 1};  // a diverged peer's line: not a vote
  EXPECT_EQ(AllreducePaths::decide(garbage.data(), 3), Path::slots);
}

}  // namespace
}  // namespace lockstep::shm
