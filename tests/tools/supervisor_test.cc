// The launcher's supervisor on a test clock: the grace period between
// SIGTERM and SIGKILL is measured on the clock it is given, so a rank that
// ignores SIGTERM is killed once that clock passes the grace period, however
// little real time went by, and not before. With --on-rank-failure
// continue, a rank that dies does not stop the others: the attempt is
// good when the ranks that outlived it finish cleanly; with
// --max-replacements the dead rank is started again.
#include <gtest/gtest.h>

#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <future>
#include <thread>

#include "common/clock.h"
#include "harness/launcher.h"
#include "harness/manual_clock.h"
#include "harness/process_ranks.h"
#include "run/supervisor.h"

namespace lockstep::cli {
namespace {

using namespace std::chrono_literals;

// A signalfd that never becomes readable: the supervisor reaps its ranks on
// every pass of its loop anyway.
class QuietSignalFd {
 public:
  QuietSignalFd() {
    sigset_t none;
    sigemptyset(&none);
    fd_ = ::signalfd(-1, &none, SFD_NONBLOCK | SFD_CLOEXEC);
  }
  ~QuietSignalFd() { ::close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

TEST(SupervisorClock, ARankIgnoringSigtermIsKilledWhenTheGracePeriodPassesOnItsClock) {
  testing::ManualClock clock;
  QuietSignalFd signals;
  ASSERT_GE(signals.fd(), 0);
  const testing::TempDir dir;  // removed with the test, where a mkdtemp stayed behind
  const std::string ready = dir.path() + "/ready";
  std::vector<RankProcess> ranks;
  // Marks that it ignores SIGTERM (an ignored signal stays ignored across
  // exec), then outlives any test.
  ranks.emplace_back(0, std::vector<std::string>{"/bin/sh", "-c", "trap '' TERM; touch \"$READY\"; exec sleep 600"},
                     std::map<std::string, std::string>{{"READY", ready}});
  SupervisorOptions options;
  options.clock = &clock;
  options.grace = std::chrono::hours(1);
  options.monitor_interval = 0ms;
  std::atomic<bool> stop_asked{false};
  // Another node's failure: the supervisor stops its ranks (SIGTERM) as soon
  // as its rank has started ignoring SIGTERM.
  options.remote_failure = [&]() -> std::optional<std::string> {
    if (!stop_asked.load()) return std::nullopt;
    return std::string("another node failed");
  };
  const auto start = Clock::now();
  auto supervised = std::async(std::launch::async, [&] { return supervise(ranks, signals.fd(), options); });
  ASSERT_TRUE(testing::wait_for_file(ready, 30s)) << "the rank never started";
  stop_asked = true;
  // Within the grace period (the clock has not moved) the rank lives on.
  EXPECT_EQ(supervised.wait_for(500ms), std::future_status::timeout) << "killed before the grace period passed";
  const auto done = [&] { return supervised.wait_for(0s) == std::future_status::ready; };
  ASSERT_TRUE(testing::advance_until(clock, std::chrono::minutes(10), done)) << "never killed";
  const AttemptResult result = supervised.get();
  ASSERT_TRUE(result.first_failure);
  EXPECT_EQ(result.first_failure->reported_by, "another node failed");
  EXPECT_EQ(ranks[0].status().signal, SIGKILL) << ranks[0].status().describe();
  EXPECT_LT(seconds_between(start, Clock::now()), 30.0) << "the hour's grace period was waited out in real time";
}

// Three ranks; rank 1 dies at once, rank 2 ends cleanly after it, and rank 0
// last, with `last_exit`.
AttemptResult supervise_with_a_death(const std::string& last_exit, std::vector<int>& told) {
  QuietSignalFd signals;
  std::vector<RankProcess> ranks;
  ranks.emplace_back(0, std::vector<std::string>{"/bin/sh", "-c", "sleep 0.8; exit " + last_exit}, std::map<std::string, std::string>{});
  ranks.emplace_back(1, std::vector<std::string>{"/bin/sh", "-c", "kill -KILL $$"}, std::map<std::string, std::string>{});
  ranks.emplace_back(2, std::vector<std::string>{"/bin/sh", "-c", "sleep 0.3"}, std::map<std::string, std::string>{});
  SupervisorOptions options;
  options.continue_after_rank_failure = true;
  options.rank_lost = [&](int rank, int) { told.push_back(rank); };
  return supervise(ranks, signals.fd(), options);
}

TEST(SupervisorContinue, ARankThatDiesLeavesTheOthersRunningAndTheLauncherIsTold) {
  std::vector<int> told;
  const AttemptResult result = supervise_with_a_death("0", told);
  EXPECT_TRUE(result.ok);
  EXPECT_FALSE(result.first_failure);
  EXPECT_EQ(result.survived_loss_of, std::vector<int>{1});
  EXPECT_EQ(told, std::vector<int>{1});
}

// The last rank standing failed too: nothing outlived the deaths.
TEST(SupervisorContinue, WhenTheLastRankFailsTheAttemptFailsNamingTheFirstDeath) {
  std::vector<int> told;
  const AttemptResult result = supervise_with_a_death("3", told);
  EXPECT_FALSE(result.ok);
  ASSERT_TRUE(result.first_failure);
  EXPECT_EQ(result.first_failure->rank, 1);
  EXPECT_EQ(result.first_failure->status.signal, SIGKILL);
}

// A frozen rank its peers re-formed without is killed once the launcher
// reads that they dropped it, which can be after they all finished: the
// attempt is good, since they went on without it (they said so) and ended
// cleanly.
TEST(SupervisorContinue, ARankDroppedByItsPeersAndKilledAfterTheyFinishedIsNotTheAttemptsFailure) {
  QuietSignalFd signals;
  std::vector<RankProcess> ranks;
  ranks.emplace_back(0, std::vector<std::string>{"/bin/sh", "-c", "exit 0"}, std::map<std::string, std::string>{});
  ranks.emplace_back(1, std::vector<std::string>{"/bin/sh", "-c", "sleep 30"}, std::map<std::string, std::string>{});
  SupervisorOptions options;
  options.continue_after_rank_failure = true;
  // Rank 1 reads as dropped only half a second in, long after rank 0 ended
  // (the launcher's late read).
  const auto start = std::chrono::steady_clock::now();
  options.dropped = [start](int rank, int) { return rank == 1 && std::chrono::steady_clock::now() - start > 500ms; };
  options.rank_lost = [](int, int) {};
  const AttemptResult result = supervise(ranks, signals.fd(), options);
  EXPECT_TRUE(result.ok);
  EXPECT_FALSE(result.first_failure);
  EXPECT_EQ(result.survived_loss_of, std::vector<int>{1});
}

// --max-replacements: rank 1 dies twice and is started again each time
// (its starts 1 and 2, told by their incarnation), up to the budget; the
// launcher hears each death with the start that died.
TEST(SupervisorReplacements, ARankThatDiesIsStartedAgainUpToTheBudget) {
  QuietSignalFd signals;
  std::vector<RankProcess> ranks;
  ranks.emplace_back(0, std::vector<std::string>{"/bin/sh", "-c", "sleep 1.5"}, std::map<std::string, std::string>{});
  ranks.emplace_back(1, std::vector<std::string>{"/bin/sh", "-c", "kill -KILL $$"}, std::map<std::string, std::string>{});
  std::vector<std::pair<int, int>> lost;
  std::vector<int> started;
  SupervisorOptions options;
  options.continue_after_rank_failure = true;
  options.rank_lost = [&](int rank, int incarnation) { lost.emplace_back(rank, incarnation); };
  options.replacements = 2;
  options.start_replacement = [&](std::size_t local, int incarnation) {
    started.push_back(incarnation);
    // The first replacement dies as its predecessor did; the second ends cleanly.
    const std::string script = incarnation == 1 ? "kill -KILL $$" : "sleep 0.3";
    return RankProcess(static_cast<int>(local), std::vector<std::string>{"/bin/sh", "-c", script},
                       std::map<std::string, std::string>{});
  };
  options.joined = [](int, int) { return true; };
  const AttemptResult result = supervise(ranks, signals.fd(), options);
  EXPECT_TRUE(result.ok);
  EXPECT_EQ(started, (std::vector<int>{1, 2}));
  EXPECT_EQ(lost, (std::vector<std::pair<int, int>>{{1, 0}, {1, 1}}));
  EXPECT_EQ(result.replaced, (std::vector<int>{1, 1}));
}

// A replacement that ends cleanly without having joined (the job had
// finished, or was ending) did not go on with the job: when every rank
// that did go on failed, so did the attempt.
TEST(SupervisorReplacements, AReplacementThatNeverJoinedDoesNotMakeAFailedAttemptGood) {
  QuietSignalFd signals;
  std::vector<RankProcess> ranks;
  ranks.emplace_back(0, std::vector<std::string>{"/bin/sh", "-c", "sleep 0.5; exit 3"}, std::map<std::string, std::string>{});
  ranks.emplace_back(1, std::vector<std::string>{"/bin/sh", "-c", "kill -KILL $$"}, std::map<std::string, std::string>{});
  SupervisorOptions options;
  options.continue_after_rank_failure = true;
  options.replacements = 1;
  options.start_replacement = [&](std::size_t local, int) {
    return RankProcess(static_cast<int>(local), std::vector<std::string>{"/bin/sh", "-c", "sleep 1"},
                       std::map<std::string, std::string>{});
  };
  options.joined = [](int, int) { return false; };
  const AttemptResult result = supervise(ranks, signals.fd(), options);
  EXPECT_FALSE(result.ok);
  ASSERT_TRUE(result.first_failure);
  EXPECT_EQ(result.first_failure->rank, 1);
}

// A replacement refused by the running group (or failed as it started)
// ends with an error before it joined, after the others finished: it was
// never a member, so the ranks that outlived the member lost, and ended
// cleanly, make the attempt good.
TEST(SupervisorReplacements, AReplacementThatFailsBeforeJoiningIsNotALossOfTheGroup) {
  QuietSignalFd signals;
  std::vector<RankProcess> ranks;
  ranks.emplace_back(0, std::vector<std::string>{"/bin/sh", "-c", "sleep 0.3"}, std::map<std::string, std::string>{});
  ranks.emplace_back(1, std::vector<std::string>{"/bin/sh", "-c", "kill -KILL $$"}, std::map<std::string, std::string>{});
  SupervisorOptions options;
  options.continue_after_rank_failure = true;
  options.rank_lost = [](int, int) {};
  options.replacements = 1;
  options.start_replacement = [&](std::size_t local, int) {
    return RankProcess(static_cast<int>(local), std::vector<std::string>{"/bin/sh", "-c", "sleep 0.8; exit 1"},
                       std::map<std::string, std::string>{});
  };
  options.joined = [](int, int) { return false; };
  const AttemptResult result = supervise(ranks, signals.fd(), options);
  EXPECT_TRUE(result.ok);
  EXPECT_FALSE(result.first_failure);
  EXPECT_EQ(result.replaced, std::vector<int>{1});
}

}  // namespace
}  // namespace lockstep::cli
