// The elastic rendezvous's heartbeats between launchers that are threads
// over one in-memory store: a node that stops beating is named and the next
// round opens, the others learn why, a finished node is not taken for lost,
// the store's node stops waiting for a silent one, a stopped launcher says
// so, and a node silent while a round forms is left out of it.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include <fmt/format.h>

#include "harness/manual_clock.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"

namespace lockstep::cli {
namespace {

using std::chrono::milliseconds;

ElasticOptions options(int min_nodes, Duration join_timeout = std::chrono::seconds(10), Os& clock = Os::real()) {
  ElasticOptions o;
  o.clock = &clock;
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

// Options for one of two nodes. On a test's clock, which stands still, the
// last call would never end: the round closes at its maximum of two.
ElasticOptions two_node_options(Os& clock) {
  ElasticOptions o = options(2, std::chrono::seconds(10), clock);
  if (&clock != &Os::real()) o.max_nodes = 2;
  return o;
}

// Two launchers, on hosts "a" and "b", in round 0; `clock` measures their
// timeouts and silences.
struct TwoNodes {
  explicit TwoNodes(Os& clock = Os::real())
      : a{store, two_node_options(clock), 1, "a", -1}, b{store, two_node_options(clock), 1, "b", -1} {
    auto joined = std::async(std::launch::async, [&] { return b.next_round(); });
    ra = *a.next_round();
    rb = *joined.get();
  }
  HashStore store;
  ElasticRendezvous a;
  ElasticRendezvous b;
  Round ra, rb;
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

// The pause is measured on the launcher's clock: moving it stands for a
// launcher stopped (SIGSTOP) for that long, exactly.
TEST(ElasticHeartbeat, ALauncherThatWasStoppedSaysSo) {
  testing::ManualClock clock;
  TwoNodes nodes(clock);
  nodes.a.note_poll(nodes.ra);
  nodes.a.note_poll(nodes.ra);
  EXPECT_EQ(nodes.a.pause_note(), "");
  clock.advance(milliseconds(500));  // over the limit of 0.3 s
  nodes.a.note_poll(nodes.ra);
  EXPECT_TRUE(contains(nodes.a.pause_note(), "this launcher itself was stopped for 0.5 s")) << nodes.a.pause_note();
  nodes.a.note_poll(nodes.ra);
  EXPECT_EQ(nodes.a.pause_note(), "");
  clock.advance(milliseconds(250));  // under the limit: no note
  EXPECT_EQ(nodes.a.pause_note(), "");
  // Stopped amid a poll's requests.
  clock.advance(milliseconds(350));
  EXPECT_TRUE(contains(nodes.a.pause_note(), "this launcher itself was stopped for 0.6 s")) << nodes.a.pause_note();
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

// The join timeout is measured on the launcher's clock: one node of the two
// needed is told so once that clock passes 300 s, in no real time.
TEST(ElasticRendezvousClock, TooFewNodesAtTheJoinTimeoutIsAConfigError) {
  testing::ManualClock clock;
  HashStore store;
  ElasticRendezvous a(store, options(2, std::chrono::seconds(300), clock), 1, "a", -1);
  auto joining = std::async(std::launch::async, [&] { return a.next_round(); });
  const auto ready = [&] { return joining.wait_for(Duration(0)) == std::future_status::ready; };
  ASSERT_TRUE(testing::advance_until(clock, std::chrono::seconds(30), ready)) << "the join timeout never expired";
  try {
    joining.get();
    ADD_FAILURE() << "a round formed with one node of at least two";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "only 1 node(s) (a) joined rendezvous 'job' at memory within 300 s")) << e.what();
  }
}

// The last call (more nodes may still come) ends on the launcher's clock
// too: with the minimum there, the round closes once the clock has moved on
// by it, and not before.
TEST(ElasticRendezvousClock, TheRoundClosesWhenTheLastCallEndsOnItsClock) {
  testing::ManualClock clock;
  HashStore store;
  ElasticOptions o = options(1, std::chrono::seconds(600), clock);
  o.last_call = std::chrono::seconds(60);
  ElasticRendezvous a(store, o, 2, "a", -1);
  auto joining = std::async(std::launch::async, [&] { return a.next_round(); });
  // Real time alone does not close it.
  EXPECT_EQ(joining.wait_for(milliseconds(300)), std::future_status::timeout);
  const auto ready = [&] { return joining.wait_for(Duration(0)) == std::future_status::ready; };
  ASSERT_TRUE(testing::advance_until(clock, std::chrono::seconds(10), ready)) << "the last call never ended";
  const auto round = joining.get();
  ASSERT_TRUE(round);
  EXPECT_EQ(round->nnodes, 1);
  EXPECT_EQ(round->world_size, 2);
  EXPECT_EQ(store.get("rdzv/0/closed"), "1");
}

}  // namespace
}  // namespace lockstep::cli
