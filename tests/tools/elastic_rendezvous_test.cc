// The elastic rendezvous's heartbeats between launchers that are threads
// over one in-memory store: a node that stops beating is named and the next
// round opens, the others learn why, a finished node is not taken for lost,
// the store's node stops waiting for a silent one, a stopped launcher says
// so, and a node silent while a round forms is left out of it.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include <fmt/format.h>

#include "lockstep/error.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"

namespace lockstep::cli {
namespace {

using std::chrono::milliseconds;

ElasticOptions options(int min_nodes, Duration join_timeout = std::chrono::seconds(10)) {
  ElasticOptions o;
  o.min_nodes = min_nodes;
  o.max_nodes = 3;
  o.join_timeout = join_timeout;
  o.last_call = milliseconds(100);
  o.id = "job";
  o.endpoint = "memory";
  o.keep_alive.interval = milliseconds(100);
  o.keep_alive.max_attempts = 3;
  return o;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Two launchers, on hosts "a" and "b", in round 0.
struct TwoNodes {
  HashStore store;
  ElasticRendezvous a{store, options(2), 1, "a", -1};
  ElasticRendezvous b{store, options(2), 1, "b", -1};
  Round ra, rb;
  TwoNodes() {
    auto joined = std::async(std::launch::async, [&] { return b.next_round(); });
    ra = *a.next_round();
    rb = *joined.get();
  }
};

// Calls `look` every 20 ms until it answers or `limit` passes.
template <typename Look>
std::optional<std::string> poll(Look look, Duration limit, Duration* took = nullptr) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    if (auto answer = look()) {
      if (took) *took = std::chrono::duration_cast<Duration>(Clock::now() - start);
      return answer;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return std::nullopt;
}

TEST(ElasticHeartbeat, ASilentNodeIsNamedAndTheNextRoundOpensForEveryone) {
  TwoNodes nodes;
  ASSERT_EQ(nodes.ra.nnodes, 2);
  EXPECT_FALSE(poll([&] { return nodes.a.watch(nodes.ra); }, milliseconds(600)));  // both beat
  nodes.b.stop_beating();
  Duration took{};
  const auto said = poll([&] { return nodes.a.watch(nodes.ra); }, std::chrono::seconds(3), &took);
  ASSERT_TRUE(said);
  EXPECT_TRUE(contains(*said, fmt::format("node {} (host b) stopped beating", nodes.rb.node_rank))) << *said;
  EXPECT_TRUE(contains(*said, "keep_alive_interval 0.1 s x keep_alive_max_attempt 3")) << *said;
  EXPECT_TRUE(contains(*said, "re-forming the group without it")) << *said;
  // Within the bound: interval x (attempts + 1) + 2 x the poll period, and
  // no sooner than (attempts - 1) intervals after the last beat.
  EXPECT_GE(took, milliseconds(200));
  EXPECT_LE(took, milliseconds(400 + 2 * 20 + 300)) << "slack for a loaded machine";
  EXPECT_EQ(nodes.store.get("rdzv/round"), "1");
  // The silent node, back, learns that its round is over and why.
  const auto over = nodes.b.watch(nodes.rb);
  ASSERT_TRUE(over);
  EXPECT_TRUE(contains(*over, "round 0 of rendezvous 'job' is over: node")) << *over;
  EXPECT_TRUE(contains(*over, "(host b) stopped beating")) << *over;
}

TEST(ElasticHeartbeat, ANodeWhoseRanksFinishedIsNotTakenForLost) {
  TwoNodes nodes;
  nodes.b.mark_done(nodes.rb);
  nodes.b.stop_beating();  // it leaves
  EXPECT_FALSE(poll([&] { return nodes.a.watch(nodes.ra); }, milliseconds(800)));
  EXPECT_FALSE(nodes.a.silent_before_done(nodes.ra));
  EXPECT_EQ(nodes.store.get("rdzv/round"), "0");
}

TEST(ElasticHeartbeat, TheStoresNodeStopsWaitingForANodeSilentBeforeItFinished) {
  TwoNodes nodes;
  nodes.a.mark_done(nodes.ra);
  EXPECT_FALSE(poll([&] { return nodes.a.silent_before_done(nodes.ra); }, milliseconds(500)));
  nodes.b.stop_beating();
  const auto said = poll([&] { return nodes.a.silent_before_done(nodes.ra); }, std::chrono::seconds(3));
  ASSERT_TRUE(said);
  EXPECT_TRUE(contains(*said, "(host b) stopped beating before it said that its ranks finished")) << *said;
}

TEST(ElasticHeartbeat, ALauncherThatWasStoppedSaysSo) {
  TwoNodes nodes;
  nodes.a.note_poll(nodes.ra);
  nodes.a.note_poll(nodes.ra);
  EXPECT_EQ(nodes.a.pause_note(), "");
  std::this_thread::sleep_for(milliseconds(450));  // over the limit of 0.3 s
  nodes.a.note_poll(nodes.ra);
  EXPECT_TRUE(contains(nodes.a.pause_note(), "this launcher itself was stopped for 0.")) << nodes.a.pause_note();
  nodes.a.note_poll(nodes.ra);
  EXPECT_EQ(nodes.a.pause_note(), "");
  // Stopped amid a poll's requests.
  std::this_thread::sleep_for(milliseconds(450));
  EXPECT_TRUE(contains(nodes.a.pause_note(), "this launcher itself was stopped for 0.")) << nodes.a.pause_note();
}

TEST(ElasticHeartbeat, ANodeSilentWhileTheRoundFormsIsLeftOut) {
  HashStore store;
  // Three needed, two come; b goes silent while they wait for a third.
  ElasticRendezvous a(store, options(3, std::chrono::seconds(2)), 1, "a", -1);
  ElasticRendezvous b(store, options(3, std::chrono::seconds(2)), 1, "b", -1);
  auto a_joins = std::async(std::launch::async, [&] { return a.next_round(); });
  auto b_joins = std::async(std::launch::async, [&] { return b.next_round(); });
  std::this_thread::sleep_for(milliseconds(300));
  b.stop_beating();
  EXPECT_THROW(a_joins.get(), ConfigError);  // at the join timeout, too few
  EXPECT_THROW(b_joins.get(), ConfigError);
  ASSERT_TRUE(store.check({"rdzv/0/lost"}));
  EXPECT_TRUE(contains(store.get("rdzv/0/lost"), "(host b) stopped beating")) << store.get("rdzv/0/lost");
  EXPECT_NE(store.get("rdzv/round"), "0");
}

}  // namespace
}  // namespace lockstep::cli
