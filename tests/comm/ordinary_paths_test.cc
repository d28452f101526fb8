// The shm backend's choice between its slots and single copy for ordinary
// buffers (src/comm/shm/ordinary_paths.h): each way measured before either
// is trusted, the cheaper per byte within a size class by a margin, one
// slow operation ignored and a lasting load followed, refreshed on a
// schedule every rank shares, and a majority of the ranks' votes.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "comm/shm/ordinary_paths.h"

namespace lockstep::shm {
namespace {

using Path = OrdinaryPaths::Path;
constexpr std::size_t kMiB = 1 << 20;

// Both ways measured kFirst times at 16 MiB: the slots at `slots_ns`,
// single copy at `single_ns`.
OrdinaryPaths measured(std::int64_t slots_ns, std::int64_t single_ns) {
  OrdinaryPaths paths;
  for (std::size_t i = 0; i < OrdinaryPaths::kFirst; ++i) {
    paths.record(Path::slots, 16 * kMiB, slots_ns);
    paths.record(Path::single_copy, 16 * kMiB, single_ns);
  }
  return paths;
}

TEST(OrdinaryPaths, EachWayIsMeasuredTwiceInTurnBeforeEitherIsPreferred) {
  OrdinaryPaths paths;
  std::vector<Path> taken;
  for (int i = 0; i < 4; ++i) {
    taken.push_back(paths.vote(16 * kMiB));
    paths.record(taken.back(), 16 * kMiB, taken.back() == Path::slots ? 2'000'000 : 1'000'000);
  }
  EXPECT_EQ(taken, (std::vector<Path>{Path::slots, Path::single_copy, Path::slots, Path::single_copy}));
  EXPECT_EQ(paths.vote(16 * kMiB), Path::single_copy);
}

TEST(OrdinaryPaths, TheCheaperWayPerSizeClassWinsAndSingleCopyNeedsAMargin) {
  OrdinaryPaths paths = measured(2'000'000, 1'000'000);
  EXPECT_EQ(paths.vote(16 * kMiB), Path::single_copy);
  EXPECT_EQ(paths.vote(20 * kMiB), Path::single_copy) << "within a factor of 4: the same class";
  EXPECT_EQ(paths.vote(256 * kMiB), Path::slots) << "a class never measured: the slots first";
  EXPECT_EQ(OrdinaryPaths::size_class(16 * kMiB), OrdinaryPaths::size_class(63 * kMiB));
  EXPECT_NE(OrdinaryPaths::size_class(16 * kMiB), OrdinaryPaths::size_class(64 * kMiB));
  EXPECT_EQ(measured(2'000'000, 1'900'000).vote(16 * kMiB), Path::slots) << "5% cheaper is within the noise";
  EXPECT_EQ(measured(2'000'000, 1'700'000).vote(16 * kMiB), Path::single_copy);
}

// One operation slowed down (a preempted rank) changes nothing; a load that
// lasts a window does, and its end shows once the slots are measured again.
TEST(OrdinaryPaths, OneSlowOperationIsIgnoredALastingLoadIsFollowed) {
  OrdinaryPaths paths = measured(2'000'000, 3'000'000);
  paths.record(Path::slots, 16 * kMiB, 40'000'000);
  EXPECT_EQ(paths.vote(16 * kMiB), Path::slots);
  int loaded = 1;
  while (paths.vote(16 * kMiB) == Path::slots && loaded < 20) {
    paths.record(Path::slots, 16 * kMiB, 16'000'000);
    ++loaded;
  }
  EXPECT_EQ(paths.vote(16 * kMiB), Path::single_copy);
  EXPECT_EQ(loaded, static_cast<int>(OrdinaryPaths::kWindow)) << "a window of slow operations moves the vote";
  paths.record(Path::slots, 16 * kMiB, 2'000'000);  // a refresh, the load gone
  EXPECT_EQ(paths.vote(16 * kMiB), Path::slots);
}

TEST(OrdinaryPaths, RefreshesTakeEachWayOnceEveryPeriodByTheOperationCount) {
  int slots = 0, single = 0;
  for (std::uint64_t n = 0; n < 10 * OrdinaryPaths::kRefreshEvery; ++n) {
    const auto forced = OrdinaryPaths::forced(n);
    if (!forced) continue;
    (*forced == Path::slots ? slots : single) += 1;
  }
  EXPECT_EQ(slots, 10);
  EXPECT_EQ(single, 10);
  for (std::uint64_t n = 0; n < 2 * OrdinaryPaths::kFirst; ++n)
    EXPECT_FALSE(OrdinaryPaths::forced(n)) << "the first operations vote (each way measured first)";
}

TEST(OrdinaryPaths, SingleCopyNeedsMoreThanHalfTheVotes) {
  const std::vector<std::int64_t> half = {0, 1, 1, 0}, most = {1, 1, 0, 1}, one = {1}, none = {0, 0};
  EXPECT_EQ(OrdinaryPaths::decide(half.data(), 4), Path::slots);
  EXPECT_EQ(OrdinaryPaths::decide(most.data(), 4), Path::single_copy);
  EXPECT_EQ(OrdinaryPaths::decide(one.data(), 1), Path::single_copy);
  EXPECT_EQ(OrdinaryPaths::decide(none.data(), 2), Path::slots);
  const std::vector<std::int64_t> garbage = {7, -3, 1};  // a diverged peer's line: not a vote
  EXPECT_EQ(OrdinaryPaths::decide(garbage.data(), 3), Path::slots);
}

}  // namespace
}  // namespace lockstep::shm
