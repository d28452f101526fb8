// Under --on-rank-failure restart the launchers beat in the store, and a
// node that stops (its launcher killed, its host gone) fails the attempt
// once it has been silent past the keep-alive limit, naming it; a node
// that finished stops beating without being taken for dead. Over an
// in-memory store with real heartbeats (every 100 ms, silent after 400 ms).
// The launcher itself: launcher_test's
// ANodeKilledBeforeItsRanksReachedTheirPeersFailsTheAttemptOnceItIsSilent.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "lockstep/store.h"
#include "run/node_loss_watch.h"
#include "run/silent_node_watch.h"

namespace lockstep::cli {
namespace {

using std::chrono::milliseconds;

const KeepAlive kKeepAlive{.interval = milliseconds(100), .max_attempts = 4};

Round node_round(int node, int nnodes) {
  return Round{.number = 0, .node_rank = node, .nnodes = nnodes, .world_size = nnodes, .first_rank = node};
}

// Polls `watch` for up to `within`; what it first said, if anything.
std::optional<std::string> poll_for(SilentNodeWatch& watch, Duration within) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < end) {
    if (auto why = watch.poll()) return why;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return std::nullopt;
}

TEST(SilentNodeWatch, ANodeThatStopsBeatingFailsTheAttemptNamingIt) {
  HashStore store;
  SilentNodeWatch node0(store, node_round(0, 3), kKeepAlive);
  SilentNodeWatch node1(store, node_round(1, 3), kKeepAlive);
  auto node2 = std::make_unique<SilentNodeWatch>(store, node_round(2, 3), kKeepAlive);
  EXPECT_EQ(poll_for(node0, milliseconds(1200)), std::nullopt) << "every node beats";

  node2.reset();  // killed: it stops beating
  const auto stopped = std::chrono::steady_clock::now();
  const auto why = poll_for(node0, std::chrono::seconds(5));
  ASSERT_TRUE(why) << "node 2 was never found silent";
  EXPECT_GE(std::chrono::steady_clock::now() - stopped, milliseconds(400)) << "before the limit";
  EXPECT_NE(why->find("node 2 has not been heard from in the store for "), std::string::npos) << *why;
  EXPECT_NE(why->find("keep_alive_interval"), std::string::npos) << *why;
  EXPECT_EQ(poll_for(node1, std::chrono::seconds(5)).value_or("").find("node 2 "), 0u) << "node 1 sees it too";
}

TEST(SilentNodeWatch, ANodeThatFinishedIsNotSilent) {
  HashStore store;
  SilentNodeWatch node0(store, node_round(0, 2), kKeepAlive);
  auto node1 = std::make_unique<SilentNodeWatch>(store, node_round(1, 2), kKeepAlive);
  node1->mark_finished();
  EXPECT_TRUE(store.check({node_keys::finished(0, 1)}));
  node1.reset();
  EXPECT_EQ(poll_for(node0, milliseconds(1500)), std::nullopt);
}

// A node that never beat at all (killed before its watch started) is
// silent from the first look on.
TEST(SilentNodeWatch, ANodeThatNeverBeatIsSilentTooAfterTheLimit) {
  HashStore store;
  SilentNodeWatch node0(store, node_round(0, 2), kKeepAlive);
  const auto why = poll_for(node0, std::chrono::seconds(5));
  ASSERT_TRUE(why);
  EXPECT_EQ(why->find("node 1 has not been heard from"), 0u) << *why;
}

}  // namespace
}  // namespace lockstep::cli
