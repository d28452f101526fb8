// A node brought back to a running job of a fixed node count, over an
// in-memory store with real heartbeats (every 100 ms, lost after 400 ms): it
// takes a lost node's place as its next generation, with starts numbered
// after every one the loss covered, again after its own loss; it never
// takes a node still heard from, nor one of a job that does not go on
// without lost nodes; and it must run as many ranks as the lost node. In
// an elastic job, a launcher that arrives takes the place of the node the
// running round lost, waiting for the loss where the round is full, and
// none where nothing is lost and the round has room. Started again after a
// death that restarts the job, it joins the restart's attempt, also before
// the others have seen the death.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "common/host.h"
#include "common/launcher_keys.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "run/failure_report.h"
#include "run/elastic_rendezvous.h"
#include "run/node_loss_watch.h"
#include "run/node_takeover.h"

namespace lockstep::cli {
namespace {

using std::chrono::milliseconds;

constexpr int kNodes = 2;
constexpr int kRanksPerNode = 2;
const KeepAlive kKeepAlive{.interval = milliseconds(100), .max_attempts = 4};

Round node_round(int node) {
  return Round{.number = 0, .node_rank = node, .nnodes = kNodes, .world_size = kNodes * kRanksPerNode,
               .first_rank = node * kRanksPerNode};
}

// What the first launchers of a two-node job leave in the store after the
// static rendezvous of attempt 0.
void rendezvous_done(Store& store) {
  for (int node = 0; node < kNodes; ++node) {
    store.set(fmt::format("launcher/0/node/{}", node), fmt::format("first launcher of node {}", node));
    store.set(fmt::format("launcher/0/nproc/{}", node), std::to_string(kRanksPerNode));
  }
}

// Polls `watch` until it has marked node 1's `generation` lost (5 s at most).
void until_lost(NodeLossWatch& watch, Store& store, int generation) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!store.check({node_keys::lost(0, 1, generation)})) {
    ASSERT_FALSE(watch.poll());
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "node 1 was not marked lost";
    std::this_thread::sleep_for(milliseconds(20));
  }
}

TEST(NodeTakeover, ALostNodeIsTakenOverAgainAndAgainWithStartsAfterEveryOneItsLossCovered) {
  HashStore store;
  rendezvous_done(store);
  NodeLossWatch node0(store, node_round(0), kRanksPerNode, kKeepAlive);
  auto node1 = std::make_unique<NodeLossWatch>(store, node_round(1), kRanksPerNode, kKeepAlive);
  // Node 1 replaced its rank 3 once by itself before it was lost.
  EXPECT_EQ(store.add(launcher_starts_key(0, 3), 1), 1);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(node0.poll(), std::nullopt);  // both beat: nobody lost
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_FALSE(store.check({node_keys::lost(0, 1, 0)}));
  EXPECT_EQ(attempt_to_join(store, 1, true, Deadline::after(milliseconds(100)), -1), 0);

  node1.reset();  // killed: it stops beating
  until_lost(node0, store, 0);
  EXPECT_EQ(lost_node_count(store, 0), 1);
  EXPECT_EQ(store.get(launcher_node_lost_key(0, 2)), "0");
  EXPECT_EQ(store.get(launcher_node_lost_key(0, 3)), "1");

  auto first = take_over_lost_node(store, 1, kNodes, kRanksPerNode, 0, milliseconds(500), -1);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->generation, 1);
  EXPECT_EQ(first->round.first_rank, 2);
  EXPECT_EQ(first->round.world_size, 4);
  EXPECT_EQ(first->incarnations, (std::vector<int>{1, 2}));  // each after every start of its rank so far
  EXPECT_EQ(lost_node_count(store, 0), 0);

  // The new generation is watched: beating, it is not lost; killed, it is.
  node1 = std::make_unique<NodeLossWatch>(store, first->round, kRanksPerNode, kKeepAlive, first->generation);
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(node0.poll(), std::nullopt);
    EXPECT_EQ(node1->poll(), std::nullopt);
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_FALSE(store.check({node_keys::lost(0, 1, 1)}));
  node1.reset();
  until_lost(node0, store, 1);
  EXPECT_EQ(store.get(launcher_node_lost_key(0, 2)), "1");
  EXPECT_EQ(store.get(launcher_node_lost_key(0, 3)), "2");

  auto second = take_over_lost_node(store, 1, kNodes, kRanksPerNode, 0, milliseconds(500), -1);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->generation, 2);
  EXPECT_EQ(second->incarnations, (std::vector<int>{2, 3}));
  // Only one launcher takes a generation's place.
  store.set(node_keys::lost(0, 1, 2), "test: generation 2 lost");
  store.set("launcher/0/node/1.3", "host other (pid 1)");
  try {
    take_over_lost_node(store, 1, kNodes, kRanksPerNode, 0, milliseconds(500), -1);
    FAIL() << "a second launcher took the same generation";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("host other (pid 1) took the place of lost node 1 first"), std::string::npos)
        << e.what();
  }
}

TEST(NodeTakeover, ANodeStillHeardFromIsNotTakenAndTheTwoLaunchersAreNamed) {
  HashStore store;
  rendezvous_done(store);
  NodeLossWatch node0(store, node_round(0), kRanksPerNode, kKeepAlive);
  NodeLossWatch node1(store, node_round(1), kRanksPerNode, kKeepAlive);
  std::this_thread::sleep_for(milliseconds(200));  // its first beats
  try {
    take_over_lost_node(store, 1, kNodes, kRanksPerNode, 0, milliseconds(300), -1);
    FAIL() << "took the place of a node still beating";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 of the running job (attempt 0) is still heard from in the store"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("--node-rank 1 was given to two launchers"), std::string::npos) << e.what();
  }
  EXPECT_EQ(store.add(node_keys::generation(0, 1), 0), 0);
}

TEST(NodeTakeover, AJobThatDoesNotWatchForLostNodesOrWaitsForTheNodeIsJoinedByTheRendezvous) {
  HashStore store;
  store.set("launcher/0/node/0", "first launcher of node 0");
  // Node 1 not yet held: the rendezvous of attempt 0 waits for it.
  EXPECT_FALSE(take_over_lost_node(store, 1, kNodes, kRanksPerNode, 0, milliseconds(300), -1));
  // Held, with no heartbeat (--on-rank-failure restart): a twin, which
  // rendezvous_static names at once.
  store.set("launcher/0/node/1", "first launcher of node 1");
  EXPECT_FALSE(take_over_lost_node(store, 1, kNodes, kRanksPerNode, 0, milliseconds(300), -1));
  // Attempt 0 failed: node 0 is about to open the restart's attempt 1.
  store.set("launcher/0/failed", "rank 1 on node 1 failed");
  std::thread restart([&store] {
    std::this_thread::sleep_for(milliseconds(300));
    store.set("launcher/1/node/0", "first launcher of node 0");
  });
  EXPECT_EQ(attempt_to_join(store, 1, true, Deadline::after(std::chrono::seconds(10)), -1), 1);
  restart.join();
  // The job restarted twice and waits for node 1 in attempt 2.
  store.set("launcher/2/node/0", "first launcher of node 0");
  EXPECT_EQ(attempt_to_join(store, 1, true, Deadline::after(milliseconds(100)), -1), 2);
}

// Started again a moment after its node died, before the others saw the
// death and marked the attempt failed: the node is held by a launcher of
// this host whose process has ended. It waits for the restart's attempt,
// rather than taking the dead launcher for a twin and stopping the job;
// where the holder lives, or is on another host, or the job goes on in
// place (no restart comes), it joins the attempt at once, as before.
TEST(NodeTakeover, ANodeStartedAgainBeforeItsDeathIsSeenWaitsForTheRestartsAttempt) {
  const pid_t ended = ::fork();
  ASSERT_GE(ended, 0);
  if (ended == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(ended, nullptr, 0), ended);
  HashStore store;
  store.set("launcher/0/node/0", "first launcher of node 0");
  store.set("launcher/0/node/1", fmt::format("host {} (pid {})", host_name(), ended));
  EXPECT_EQ(attempt_to_join(store, 1, false, Deadline::after(std::chrono::seconds(10)), -1), 0);  // in place
  EXPECT_FALSE(store.check({"launcher/0/failed"})) << "in place, the others go on: nothing fails";
  // Under restarts the launcher marks the attempt failed itself (the others
  // may never see the death), and node 0 opens the restart's attempt.
  std::thread restart([&store] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!store.check({"launcher/0/failed"}) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(20));
    std::this_thread::sleep_for(milliseconds(200));
    store.set("launcher/1/node/0", "first launcher of node 0");
  });
  EXPECT_EQ(attempt_to_join(store, 1, true, Deadline::after(std::chrono::seconds(10)), -1), 1);
  restart.join();
  EXPECT_EQ(store.get("launcher/0/failed"),
            fmt::format("node 1's launcher (host {} (pid {})) ended during attempt 0, and a launcher started again for "
                        "node 1 is waiting to join the restart",
                        host_name(), ended));
  // A holder that ended after finishing its part is no death: nothing is
  // marked failed, and the attempt is joined at once.
  store.set("launcher/1/node/1", fmt::format("host {} (pid {})", host_name(), ended));
  store.set(node_keys::finished(1, 1), "1");
  EXPECT_EQ(attempt_to_join(store, 1, true, Deadline::after(std::chrono::seconds(10)), -1), 1);
  EXPECT_FALSE(store.check({"launcher/1/failed"}));
  // A live holder (a twin), or one on another host: attempt 1 at once.
  for (const std::string& holder : {fmt::format("host {} (pid {})", host_name(), ::getpid()),
                                    fmt::format("host {}x (pid {})", host_name(), ended)}) {
    store.set("launcher/1/node/1", holder);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(attempt_to_join(store, 1, true, Deadline::after(std::chrono::seconds(10)), -1), 1) << holder;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << holder;
  }
}

TEST(NodeTakeover, TheNodeTakingALostOnesPlaceMustRunAsManyRanks) {
  HashStore store;
  rendezvous_done(store);
  NodeLossWatch node0(store, node_round(0), kRanksPerNode, kKeepAlive);
  {
    NodeLossWatch node1(store, node_round(1), kRanksPerNode, kKeepAlive);
  }
  until_lost(node0, store, 0);
  try {
    take_over_lost_node(store, 1, kNodes, kRanksPerNode + 1, 0, milliseconds(300), -1);
    FAIL() << "took the place with another rank count";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 ran 2 rank(s) and this launcher was given --nproc-per-node 3"),
              std::string::npos)
        << e.what();
  }
}

// An elastic round 0 of two nodes, running (closed), each node described
// as publish_elastic_node does under --on-rank-failure continue.
void elastic_round_running(Store& store) {
  store.set("rdzv/round", "0");
  store.set("rdzv/0/closed", std::to_string(kNodes));
  for (int node = 0; node < kNodes; ++node) publish_elastic_node(store, node_round(node), kRanksPerNode);
}

ElasticOptions elastic_options(int max_nodes) {
  ElasticOptions o;
  o.min_nodes = kNodes;
  o.max_nodes = max_nodes;
  o.keep_alive = kKeepAlive;
  return o;
}

TEST(NodeTakeover, InAnElasticJobALauncherThatArrivesTakesTheNodeTheRunningRoundLost) {
  HashStore store;
  elastic_round_running(store);
  NodeLossWatch node0(store, node_round(0), kRanksPerNode, kKeepAlive);
  auto node1 = std::make_unique<NodeLossWatch>(store, node_round(1), kRanksPerNode, kKeepAlive);
  ElasticRendezvous arriving(store, elastic_options(kNodes), kRanksPerNode, "arriving", -1);
  // The round is full and nothing is lost yet: the launcher waits for a loss.
  auto taken = std::async(std::launch::async, [&] {
    return take_over_a_lost_node(store, arriving, kRanksPerNode, milliseconds(200), -1);
  });
  EXPECT_EQ(taken.wait_for(milliseconds(500)), std::future_status::timeout) << "it did not wait for a loss";
  node1.reset();  // killed
  until_lost(node0, store, 0);
  const auto t = taken.get();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->generation, 1);
  EXPECT_EQ(t->round.number, 0);
  EXPECT_EQ(t->round.node_rank, 1);
  EXPECT_EQ(t->round.first_rank, 2);
  EXPECT_EQ(t->round.world_size, 4);
  EXPECT_EQ(t->incarnations, (std::vector<int>{1, 1}));
  EXPECT_EQ(lost_node_count(store, 0), 0);
}

TEST(NodeTakeover, InAnElasticJobWithRoomAndNothingLostTheLauncherJoinsTheNextRound) {
  HashStore store;
  elastic_round_running(store);
  NodeLossWatch node0(store, node_round(0), kRanksPerNode, kKeepAlive);
  NodeLossWatch node1(store, node_round(1), kRanksPerNode, kKeepAlive);
  ElasticRendezvous arriving(store, elastic_options(kNodes + 1), kRanksPerNode, "arriving", -1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(take_over_a_lost_node(store, arriving, kRanksPerNode, milliseconds(300), -1), std::nullopt);
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(300)) << "it did not wait for a loss first";
  // No round runs (one forms): nothing to take, at once.
  store.set("rdzv/round", "1");
  EXPECT_EQ(take_over_a_lost_node(store, arriving, kRanksPerNode, milliseconds(300), -1), std::nullopt);
}

}  // namespace
}  // namespace lockstep::cli
