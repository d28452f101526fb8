// Never hang silently: a rank that skips a collective, a rank stuck in a
// sleep, and mismatched collectives are named, within seconds or within the
// timeout; the launcher exits non-zero with the report and leaves no
// process; SIGUSR1 dumps the flight recorder without stopping the rank.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::Launcher;
using testing::TempDir;

using testing::contains;

struct Run {
  testing::RankResult result;
  double seconds;
  std::vector<pid_t> pids;
};

Run run_scenario(const std::string& mode, testing::EnvMap env, const TempDir& dir, const std::string& backend = "shm") {
  env["PID_DIR"] = dir.path();
  env["LOCKSTEP_FLIGHT_DIR"] = dir.path();
  env["LOCKSTEP_BACKEND"] = backend;
  const auto start = Clock::now();
  Launcher launcher(LOCKSTEP_CLI, {"--nproc-per-node", "3", "--grace-period", "1", "--", DIAG_PROGRAM, mode}, env);
  Run run{launcher.wait(60s), 0, {}};
  run.seconds = seconds_between(start, Clock::now());
  run.pids = testing::pids_in(dir.path(), 3);
  return run;
}

// The job failed within `seconds` and left no rank behind.
void expect_failed_fast(const Run& run, double seconds) {
  EXPECT_NE(run.result.exit_code, 0) << testing::describe(run.result);
  EXPECT_LT(run.seconds, seconds) << "must not wait for the timeout";
  testing::expect_gone(run.pids);
}

class Watchdog : public ::testing::TestWithParam<std::string> {};

TEST_P(Watchdog, NamesTheRankThatSkippedACollective) {
  TempDir dir;
  const auto run = run_scenario("skip", {{"LOCKSTEP_TIMEOUT", "3"}}, dir, GetParam());
  expect_failed_fast(run, 20.0);
  EXPECT_TRUE(contains(run.result.output, "rank(s) 1 never reached #1")) << run.result.output;
  EXPECT_TRUE(contains(run.result.output, "failed first")) << run.result.output;
}

// Before the timeout: the stall inspector names the rank that has not
// reached the collective the others wait in, and the job goes on waiting.
TEST_P(Watchdog, WarnsOfAStallBeforeTheTimeoutNamingTheMissingRank) {
  TempDir dir;
  const auto run = run_scenario("stuck", {{"LOCKSTEP_TIMEOUT", "5"}, {"LOCKSTEP_STALL_WARNING", "1"}}, dir, GetParam());
  expect_failed_fast(run, 25.0);
  const std::string& out = run.result.output;
  const auto stall = out.find("stall: operation #0");
  ASSERT_NE(stall, std::string::npos) << out;
  EXPECT_TRUE(contains(out.substr(stall), "rank(s) 1 never reached #0")) << out;
  EXPECT_TRUE(contains(out, "(it fails at the 5.0 s timeout)")) << out;
  // The warning came first; the timeout's verdict after it.
  EXPECT_LT(stall, out.find("did not complete")) << out;
}

TEST_P(Watchdog, NamesARankStuckInASleep) {
  TempDir dir;
  const auto run = run_scenario("stuck", {{"LOCKSTEP_TIMEOUT", "3"}}, dir, GetParam());
  expect_failed_fast(run, 20.0);
  EXPECT_TRUE(contains(run.result.output, "rank(s) 1 never reached #0")) << run.result.output;
  EXPECT_TRUE(contains(run.result.output, "rank 1 (pid")) << run.result.output;
  EXPECT_TRUE(contains(run.result.output, "flight recorder:")) << run.result.output;
}

TEST_P(Watchdog, DetailModeNamesAMismatchedCollectiveWithinSeconds) {
  TempDir dir;
  const auto run = run_scenario("mismatch", {{"LOCKSTEP_TIMEOUT", "60"}, {"LOCKSTEP_DEBUG", "DETAIL"}}, dir, GetParam());
  expect_failed_fast(run, 10.0);  // well before the 60 s timeout
  EXPECT_TRUE(contains(run.result.output, "rank 1 issued broadcast #0 (float x 10, root 0) while ranks 0, 2 issued "
                                          "allreduce #0 (float x 1000, sum)"))
      << run.result.output;
}

TEST_P(Watchdog, DetailModeNamesTheRankThatSkippedACollectiveWithinSeconds) {
  TempDir dir;
  const auto run =
      run_scenario("skip-broadcast", {{"LOCKSTEP_TIMEOUT", "60"}, {"LOCKSTEP_DEBUG", "DETAIL"}}, dir, GetParam());
  expect_failed_fast(run, 10.0);  // well before the 60 s timeout
  EXPECT_TRUE(contains(run.result.output, "rank 1 issued allreduce #0 (float x 1000, sum) while ranks 0, 2 issued "
                                          "broadcast #0 (float x 10, root 0)"))
      << run.result.output;
  EXPECT_TRUE(contains(run.result.output, "LOCKSTEP_DEBUG=DETAIL found that the ranks disagree")) << run.result.output;
}

// A rank stopped outright (SIGSTOP: its watchdog cannot answer either) is
// named within the timeout plus the settle second, and the launcher ends
// the job at once (it continues stopped ranks, so they act on its SIGTERM)
// instead of after its grace period, here 30 s.
TEST_P(Watchdog, NamesAStoppedRankAndEndsTheJobSoonAfterTheTimeout) {
  TempDir dir;
  const auto start = Clock::now();
  Launcher launcher(LOCKSTEP_CLI, {"--nproc-per-node", "3", "--grace-period", "30", "--", DIAG_PROGRAM, "stuck"},
                    {{"PID_DIR", dir.path()},
                     {"LOCKSTEP_FLIGHT_DIR", dir.path()},
                     {"LOCKSTEP_BACKEND", GetParam()},
                     {"LOCKSTEP_TIMEOUT", "3"}});
  ASSERT_TRUE(testing::wait_for_file(dir.path() + "/rank1.pid", 30s));
  pid_t pid = 0;
  for (const Deadline deadline = Deadline::after(10s); pid <= 0 && !deadline.expired();) {
    std::ifstream(dir.path() + "/rank1.pid") >> pid;  // the file may be seen before its number is written
    if (pid <= 0) std::this_thread::sleep_for(10ms);
  }
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  const auto result = launcher.wait(60s);
  const double seconds = seconds_between(start, Clock::now());
  EXPECT_NE(result.exit_code, 0) << testing::describe(result);
  EXPECT_TRUE(contains(result.output, "rank(s) 1 did not answer the watchdog")) << result.output;
  EXPECT_LT(seconds, 3.0 + 5.0) << "the job must end within LOCKSTEP_TIMEOUT + 5 s";
  testing::expect_gone(testing::pids_in(dir.path(), 3));
}

INSTANTIATE_TEST_SUITE_P(Backends, Watchdog, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(FlightRecorder, Sigusr1DumpsItWithoutStoppingTheRank) {
  TempDir dir;
  Launcher launcher(LOCKSTEP_CLI, {"--nproc-per-node", "2", "--", DIAG_PROGRAM, "idle"},
                    {{"PID_DIR", dir.path()}, {"LOCKSTEP_FLIGHT_DIR", dir.path()}});
  ASSERT_TRUE(testing::wait_for_file(dir.path() + "/rank1.ready", 30s));  // past its allreduce, idling
  pid_t pid = 0;
  std::ifstream(dir.path() + "/rank1.ready") >> pid;
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGUSR1);
  // The dump is written to a temporary (<name>.json.tmp.<pid>) and renamed:
  // only a name ending in .json is a whole file.
  const std::string wanted = fmt::format("-rank1-pid{}.json", pid);
  std::string dump;
  for (const Deadline deadline = Deadline::after(10s); dump.empty() && !deadline.expired();) {
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
      const std::string name = e.path().filename().string();
      if (name.rfind("lockstep-flight-", 0) == 0 && name.size() > wanted.size() &&
          name.compare(name.size() - wanted.size(), wanted.size(), wanted) == 0)
        dump = e.path().string();
    }
    if (dump.empty()) std::this_thread::sleep_for(10ms);  // polling for the file, with a deadline
  }
  ASSERT_FALSE(dump.empty()) << "no flight recorder dump after SIGUSR1";
  const auto j = nlohmann::json::parse(std::ifstream(dump));
  ASSERT_TRUE(j.contains("operations"));
  EXPECT_EQ(j["operations"][0]["op"], "allreduce");
  EXPECT_EQ(j["operations"][0]["state"], "completed");
  EXPECT_FALSE(testing::gone(pid)) << "SIGUSR1 must not kill the rank";
  launcher.signal(SIGTERM);
  launcher.wait(20s);
}

}  // namespace
}  // namespace lockstep
