// ProcessGroup::shrink (src/comm/shrink.cc) in ranks that are processes,
// with the store in a process of its own as `lockstep run` keeps it (so any
// rank may die, rank 0 included): a killed rank's peers learn it at once,
// re-form without it in the same processes and go on with exact results; a
// frozen rank is left out after the window and, woken, is told so; fewer
// than half the ranks not known to have ended stop (no split brain), and
// go on where the launcher says the others ended; a rank lost while the
// group re-forms is left out on the next attempt; under the launcher's
// restart mode, shrink is refused; after a loss, what the launcher's keys
// say of a replacement (replacements_started, ends_unseen_by_launcher).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <span>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/launcher_keys.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::describe;
using testing::EnvMap;
using testing::ProcessRanks;
using testing::RankResult;

constexpr int kStoreHost = -1;
constexpr int kLeftOut = 40;   // exit code of a rank that was told it was left out
constexpr int kNoMajority = 41;

// n ranks and, as process n, the store's host; ranks find the store as a
// launcher's (LOCKSTEP_STORE_ADDR), so it outlives any of them.
class World {
 public:
  World(int n, const std::string& backend, const std::function<void(int rank)>& body, EnvMap extra = {})
      : n_(n),
        ranks_(
            n + 1,
            [&](int r) {
              EnvMap env{{"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(n)},
                         {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(n)},
                         {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", port_.text()},
                         {"LOCKSTEP_STORE_ADDR", "127.0.0.1"}, {"LOCKSTEP_STORE_PORT", port_.text()},
                         {"LOCKSTEP_BACKEND", backend},     {"LOCKSTEP_TIMEOUT", "30"},
                         {"LOCKSTEP_CONNECT_TIMEOUT", "30"}, {"LOCKSTEP_RESTART_COUNT", "0"}};
              for (const auto& [k, v] : extra) env[k] = v;
              return env;
            },
            [&](int r) {
              if (r == n) return host_store();
              body(r);
            }) {}

  ProcessRanks& ranks() { return ranks_; }

  // The results of the n ranks (the store's host is killed after them).
  std::vector<RankResult> wait(Duration deadline) {
    std::vector<RankResult> all;
    const auto until = Clock::now() + deadline;
    while (Clock::now() < until && running_ranks() > 0) std::this_thread::sleep_for(10ms);
    ranks_.signal(n_, SIGKILL);
    all = ranks_.wait_all(30s);
    all.pop_back();
    return all;
  }

  // What `lockstep run --on-rank-failure continue` does when it reaps a
  // rank: tells the others through the store. Watches `victims` from a
  // thread of this (the test's) process until stopped.
  void report_ended(const std::vector<int>& victims) {
    reporter_ = std::thread([this, victims] {
      std::set<int> told;
      while (!stop_.load() && told.size() < victims.size()) {
        for (int v : victims) {
          siginfo_t info{};
          if (told.count(v) || ::waitid(P_PID, static_cast<id_t>(ranks_.pid(v)), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
              info.si_pid != ranks_.pid(v))
            continue;
          TcpStoreOptions options;
          options.connect_timeout = 5s;
          TcpStore store("127.0.0.1", static_cast<std::uint16_t>(port_.number()), options);
          store.set(launcher_lost_key(0, v), "ended");
          told.insert(v);
        }
        std::this_thread::sleep_for(2ms);
      }
    });
  }

  ~World() {
    stop_ = true;
    if (reporter_.joinable()) reporter_.join();
  }

 private:
  [[noreturn]] void host_store() {
    TcpStoreServer server("127.0.0.1", static_cast<std::uint16_t>(port_.number()));
    for (;;) std::this_thread::sleep_for(1s);
  }
  int running_ranks() {
    int running = 0;
    for (int r = 0; r < n_; ++r) {
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(ranks_.pid(r)), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == ranks_.pid(r))
        continue;
      ++running;
    }
    return running;
  }

  int n_;
  testing::ReservedPort port_;
  ProcessRanks ranks_;
  std::atomic<bool> stop_{false};
  std::thread reporter_;
};

// All-reduces in place, checking the sum of every rank's (rank + 1) * i.
void allreduce_and_check(ProcessGroup& pg, int times) {
  std::vector<float> v(1 << 16);
  for (int t = 0; t < times; ++t) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((pg.rank() + 1) * (i % 13));
    pg.allreduce(view(std::span(v)))->wait();
    const float ranks_sum = static_cast<float>(pg.size() * (pg.size() + 1) / 2);
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i] != ranks_sum * static_cast<float>(i % 13))
        throw std::runtime_error(fmt::format("rank {}/{}: element {} is {}", pg.rank(), pg.size(), i, v[i]));
  }
}

// A victim's all-reduces, then its death. The survivors run the same
// all-reduces inside their try: a victim that has finished one may die
// before a peer has read all of it (its socket's reset drops what the peer
// had not read), so the peer's failure can come in any of them.
[[noreturn]] void die_after(ProcessGroup& pg, int allreduces) {
  allreduce_and_check(pg, allreduces);
  ::raise(SIGKILL);
  std::abort();
}

// The lost rank the failure names, if any.
std::vector<int> lost_in(const PeerError& e, const ProcessGroup& pg) {
  if (e.peer() >= 0 && e.peer() != pg.rank()) return {e.peer()};
  return {};
}

class KilledRankShrink : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// A rank killed mid-run: the others' collective fails naming it, they
// re-form without it and their all-reduces are exact.
TEST_P(KilledRankShrink, TheOthersReformInPlaceAndGoOn) {
  const auto& [backend, victim] = GetParam();
  constexpr int n = 4;
  World world(n, backend, [victim = victim](int rank) {
    auto pg = init_process_group();
    if (rank == victim) die_after(*pg, 3);
    try {
      allreduce_and_check(*pg, 1003);
      throw std::runtime_error("no failure after the kill");
    } catch (const PeerError& e) {
      const auto noticed = Clock::now();
      auto next = pg->shrink(lost_in(e, *pg), 10s);
      const double seconds = seconds_between(noticed, Clock::now());
      if (next->size() != n - 1) throw std::runtime_error(fmt::format("re-formed with {} ranks", next->size()));
      for (int w : next->world_ranks())
        if (w == victim) throw std::runtime_error("the re-formed group still has the killed rank");
      allreduce_and_check(*next, 5);
      // How long it took is a benchmark's to judge (docs/performance.md), not a test's.
      std::printf("rank %d: re-formed as rank %d of %d in %.3f s\n", rank, next->rank(), next->size(), seconds);
    }
  });
  for (const RankResult& r : world.wait(60s)) {
    if (r.rank == victim) {
      EXPECT_EQ(r.signal, SIGKILL) << describe(r);
    } else {
      EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
      EXPECT_NE(r.output.find("re-formed as rank"), std::string::npos) << describe(r);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, KilledRankShrink,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(0, 2)),
                         [](const auto& info) {
                           return fmt::format("{}_victim{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// A rank that stops (SIGSTOP) is left out once the window passes; when it
// runs again it fails, calls shrink, and is told it was left out.
TEST(Shrink, AFrozenRankIsLeftOutAndToldSoWhenItWakes) {
  constexpr int n = 3, frozen = 2;
  std::string marker = "/tmp/lockstep-shrink-frozen-" + std::to_string(::getpid());
  World world(
      n, "tcp",
      [&](int rank) {
        auto pg = init_process_group();
        allreduce_and_check(*pg, 2);
        if (rank == frozen) {
          std::ofstream{marker};
          ::raise(SIGSTOP);
        }
        try {
          allreduce_and_check(*pg, 1000);
          throw std::runtime_error("no failure");
        } catch (const Error&) {
          try {
            auto next = pg->shrink({}, 2s);
            allreduce_and_check(*next, 3);
            std::printf("rank %d: went on in a group of %d\n", rank, next->size());
          } catch (const PeerError& e) {
            if (e.peer() != pg->rank()) throw;
            std::printf("rank %d: left out: %s\n", rank, e.what());
            std::fflush(stdout);
            std::_Exit(kLeftOut);
          }
        }
      },
      {{"LOCKSTEP_TIMEOUT", "2"}});
  ASSERT_TRUE(testing::wait_for_file(marker, 60s));
  // The others time out (2 s), wait the window (2 s) and go on; then it wakes.
  std::this_thread::sleep_for(8s);
  world.ranks().signal(frozen, SIGCONT);
  const auto results = world.wait(60s);
  std::remove(marker.c_str());
  for (const RankResult& r : results) {
    if (r.rank == frozen) {
      EXPECT_EQ(r.exit_code, kLeftOut) << describe(r);
      EXPECT_NE(r.output.find("left out of the re-formed group"), std::string::npos) << describe(r);
    } else {
      EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
      EXPECT_NE(r.output.find("went on in a group of 2"), std::string::npos) << describe(r);
    }
  }
}

// Two of four ranks gone: without word that they ended, the two left are
// no majority and stop; told by the launcher's keys that they ended, the
// two go on.
class TwoOfFour : public ::testing::TestWithParam<bool> {};

TEST_P(TwoOfFour, StopWithoutAMajorityUnlessTheOthersAreKnownToHaveEnded) {
  const bool launcher_says = GetParam();
  constexpr int n = 4;
  World world(n, "tcp", [](int rank) {
    auto pg = init_process_group();
    if (rank >= 2) die_after(*pg, 2);
    try {
      allreduce_and_check(*pg, 1002);
      throw std::runtime_error("no failure");
    } catch (const PeerError& e) {
      try {
        auto next = pg->shrink(lost_in(e, *pg), 3s);
        allreduce_and_check(*next, 3);
        std::printf("rank %d: went on in a group of %d\n", rank, next->size());
      } catch (const PeerError&) {
        throw;
      } catch (const Error& no_majority) {
        std::printf("rank %d: %s\n", rank, no_majority.what());
        std::fflush(stdout);
        std::_Exit(kNoMajority);
      }
    }
  });
  if (launcher_says) world.report_ended({2, 3});
  for (const RankResult& r : world.wait(60s)) {
    if (r.rank >= 2) continue;
    if (launcher_says) {
      EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
      EXPECT_NE(r.output.find("went on in a group of 2"), std::string::npos) << describe(r);
    } else {
      EXPECT_EQ(r.exit_code, kNoMajority) << describe(r);
      EXPECT_NE(r.output.find("without a majority this side stops"), std::string::npos) << describe(r);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Launcher, TwoOfFour, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "toldByTheLauncher" : "notTold"; });

// Under `lockstep run --on-rank-failure restart` (the default), which stops
// every rank when one dies, a group does not re-form in place: shrink is
// refused, saying how to ask for it.
TEST(Shrink, IsRefusedWhereTheLauncherRestartsTheJob) {
  constexpr int n = 3;
  World world(
      n, "tcp",
      [](int rank) {
        auto pg = init_process_group();
        if (rank == 2) die_after(*pg, 2);
        try {
          allreduce_and_check(*pg, 1002);
          throw std::runtime_error("no failure");
        } catch (const PeerError& e) {
          try {
            pg->shrink(lost_in(e, *pg), 3s);
            throw std::runtime_error("shrink went on under the launcher's restart");
          } catch (const ConfigError& refused) {
            std::printf("rank %d: %s\n", rank, refused.what());
          }
        }
      },
      {{"LOCKSTEP_ON_RANK_FAILURE", "restart"}});
  for (const RankResult& r : world.wait(60s)) {
    if (r.rank == 2) continue;
    EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
    EXPECT_NE(r.output.find("run the job with --on-rank-failure continue"), std::string::npos) << describe(r);
  }
}

// Rank 3 dies; rank 2 dies as the others re-form. The survivors' first
// attempt cannot connect its group; the second leaves rank 2 out too.
TEST(Shrink, ARankLostWhileTheGroupReformsIsLeftOutOnTheNextAttempt) {
  constexpr int n = 4;
  World world(n, "tcp", [](int rank) {
    auto pg = init_process_group();
    if (rank == 3) die_after(*pg, 2);
    std::vector<int> lost;
    try {
      allreduce_and_check(*pg, 1002);
      throw std::runtime_error("no failure");
    } catch (const PeerError& e) {
      lost = lost_in(e, *pg);
    }
    if (rank == 2) {
      // Says it is here, then dies before the new group connects.
      pg->store()->set("shrink/0/here/2", "1");
      ::raise(SIGKILL);
    }
    for (int attempt = 0;; ++attempt) {
      try {
        auto next = pg->shrink(lost, 3s);
        allreduce_and_check(*next, 3);
        std::printf("rank %d: went on in a group of %d after %d attempt(s)\n", rank, next->size(), attempt + 1);
        return;
      } catch (const PeerError& e) {
        if (e.peer() == pg->rank() || attempt > 3) throw;
        lost.clear();
      }
    }
  });
  world.report_ended({2, 3});
  for (const RankResult& r : world.wait(90s)) {
    if (r.rank >= 2) continue;
    EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
    EXPECT_NE(r.output.find("went on in a group of 2 after 2 attempt(s)"), std::string::npos) << describe(r);
  }
}

// Rank 2 dies; ranks 0 and 1 re-form, and rank 0, playing the launcher in the
// launcher's order (the replacement's start counted, then the death said,
// then the replacement's end), reads what each step tells a survivor: a
// death not yet said is a replacement that may be on its way where the
// launchers replace ranks (LOCKSTEP_MAX_REPLACEMENTS), nothing otherwise;
// once said, the start counted before it is; once the replacement's end is
// said, nothing is.
class WhatTheLauncherSays : public ::testing::TestWithParam<bool> {};

TEST_P(WhatTheLauncherSays, ADeathNotYetSaidMayBeReplacedWhereTheLaunchersReplace) {
  const bool replaces = GetParam();
  EnvMap env{{"LOCKSTEP_ON_RANK_FAILURE", "continue"}};
  if (replaces) env["LOCKSTEP_MAX_REPLACEMENTS"] = "1";
  World world(
      3, "tcp",
      [](int rank) {
        auto pg = init_process_group();
        if (rank == 2) die_after(*pg, 2);
        std::shared_ptr<ProcessGroup> two;
        try {
          allreduce_and_check(*pg, 1002);
          throw std::runtime_error("no failure");
        } catch (const PeerError& e) {
          two = pg->shrink(lost_in(e, *pg), 3s);
        }
        if (rank == 1) return;
        const auto say = [&](const char* when) {
          std::printf("%s: started %s, unseen %s\n", when, fmt::format("{}", two->replacements_started()).c_str(),
                      fmt::format("{}", two->ends_unseen_by_launcher()).c_str());
        };
        say("before the launcher saw it");
        // The launcher's store: the root of the ranks' (their groups' keys
        // are prefixed).
        TcpStore launcher("127.0.0.1", static_cast<std::uint16_t>(std::stoi(std::getenv("LOCKSTEP_STORE_PORT"))));
        launcher.add(launcher_starts_key(0, 2), 1);
        launcher.set(launcher_lost_key(0, 2, 0), "ended");
        say("replacement started");
        launcher.set(launcher_lost_key(0, 2, 1), "ended");
        say("replacement ended");
      },
      env);
  const std::vector<RankResult> results = world.wait(60s);
  const RankResult& survivor = results[0];
  ASSERT_EQ(survivor.exit_code, testing::kExitOk) << describe(survivor);
  const std::string before = replaces ? "started [], unseen [2]" : "started [], unseen []";
  EXPECT_NE(survivor.output.find("before the launcher saw it: " + before), std::string::npos) << describe(survivor);
  EXPECT_NE(survivor.output.find("replacement started: started [2], unseen []"), std::string::npos)
      << describe(survivor);
  EXPECT_NE(survivor.output.find("replacement ended: started [], unseen []"), std::string::npos) << describe(survivor);
}

INSTANTIATE_TEST_SUITE_P(Launchers, WhatTheLauncherSays, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "replace" : "doNotReplace"; });

}  // namespace
}  // namespace lockstep
