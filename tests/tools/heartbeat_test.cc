// The launchers' rendezvous heartbeats: the staleness rule on injected
// times (who is silent, for how long, and an observer that was itself
// stopped), and the beating thread over an in-memory store.
#include <gtest/gtest.h>

#include <thread>

#include "lockstep/store.h"
#include "run/heartbeat.h"

namespace lockstep::cli {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);

TEST(SilenceWatch, ANodeIsSilentOnlyAfterItsCounterStaysTheSameBeyondTheLimit) {
  SilenceWatch watch(seconds(3));
  EXPECT_FALSE(watch.look({{1, 0}, {2, 0}}, t0));
  EXPECT_FALSE(watch.look({{1, 1}, {2, 1}}, t0 + seconds(1)));
  EXPECT_FALSE(watch.look({{1, 2}, {2, 1}}, t0 + seconds(2)));
  EXPECT_FALSE(watch.look({{1, 3}, {2, 1}}, t0 + seconds(3)));
  EXPECT_FALSE(watch.look({{1, 4}, {2, 1}}, t0 + seconds(4)));  // node 2: exactly the limit
  const auto silent = watch.look({{1, 5}, {2, 1}}, t0 + milliseconds(4500));
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->node, 2);
  EXPECT_EQ(silent->for_how_long, milliseconds(3500));
}

TEST(SilenceWatch, ANewNodeHasTheWholeLimitToShowItsFirstBeat) {
  SilenceWatch watch(seconds(3));
  EXPECT_FALSE(watch.look({{1, 7}}, t0));
  EXPECT_FALSE(watch.look({{1, 8}, {2, 0}}, t0 + seconds(2)));  // node 2 joined: watched from now
  EXPECT_FALSE(watch.look({{1, 9}, {2, 0}}, t0 + seconds(4)));
  const auto silent = watch.look({{1, 10}, {2, 0}}, t0 + milliseconds(5100));
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->node, 2);
  EXPECT_EQ(silent->for_how_long, milliseconds(3100));
}

TEST(SilenceWatch, TheLongestSilenceIsNamed) {
  SilenceWatch watch(seconds(1));
  watch.look({{1, 0}, {2, 0}}, t0);
  watch.look({{1, 0}, {2, 1}}, t0 + milliseconds(500));
  watch.look({{1, 0}, {2, 1}}, t0 + milliseconds(1000));
  const auto silent = watch.look({{1, 0}, {2, 1}}, t0 + milliseconds(1600));
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->node, 1);
  EXPECT_EQ(silent->for_how_long, milliseconds(1600));
}

TEST(SilenceWatch, AnObserverThatWasStoppedAccusesNobodyAndSaysHowLong) {
  SilenceWatch watch(seconds(3));
  watch.look({{1, 0}}, t0);
  EXPECT_EQ(watch.paused(), milliseconds(0));
  // Frozen for 40 s: node 1 may have beaten all along on keys it no longer
  // shows (a new round); its silence is measured again from this look.
  EXPECT_FALSE(watch.look({{1, 0}}, t0 + seconds(40)));
  EXPECT_EQ(watch.paused(), seconds(40));
  EXPECT_FALSE(watch.look({{1, 0}}, t0 + seconds(42)));
  EXPECT_EQ(watch.paused(), milliseconds(0));
  const auto silent = watch.look({{1, 0}}, t0 + seconds(44));
  ASSERT_TRUE(silent);
  EXPECT_EQ(silent->for_how_long, seconds(4));
}

TEST(SilenceWatch, ANodeNoLongerWatchedIsForgottenAndResetStartsOver) {
  SilenceWatch watch(seconds(2));
  watch.look({{1, 0}, {2, 0}}, t0);
  watch.look({{1, 1}}, t0 + seconds(1));  // node 2 left the watched set
  EXPECT_FALSE(watch.look({{1, 2}, {2, 0}}, t0 + seconds(2)));  // back: watched afresh
  EXPECT_FALSE(watch.look({{1, 3}, {2, 0}}, t0 + seconds(3)));
  watch.reset();
  EXPECT_FALSE(watch.look({{1, 3}, {2, 0}}, t0 + seconds(10)));  // no pause after a reset
  EXPECT_EQ(watch.paused(), milliseconds(0));
}

TEST(Heartbeat, BeatsOnItsKeyEveryIntervalAndStopsWhenToldOrDestroyed) {
  auto store = std::make_shared<HashStore>();
  {
    Heartbeat beat(store, milliseconds(20));
    beat.beat_on("rdzv/0/beat/1");
    std::this_thread::sleep_for(milliseconds(300));
    const std::int64_t beats = store->add("rdzv/0/beat/1", 0);
    EXPECT_GE(beats, 5);  // 15 in theory; a loaded machine is slow
    beat.beat_on("rdzv/1/beat/0");
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_LE(store->add("rdzv/0/beat/1", 0), beats + 1);  // moved to the new key
    EXPECT_GE(store->add("rdzv/1/beat/0", 0), 1);          // which got a beat at once
    beat.beat_on("");
    std::this_thread::sleep_for(milliseconds(50));
    const std::int64_t stopped = store->add("rdzv/1/beat/0", 0);
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_EQ(store->add("rdzv/1/beat/0", 0), stopped);
    beat.beat_on("rdzv/2/beat/0");
  }
  const std::int64_t after = store->add("rdzv/2/beat/0", 0);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(store->add("rdzv/2/beat/0", 0), after);
}

}  // namespace
}  // namespace lockstep::cli
