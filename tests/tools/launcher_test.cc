// `lockstep run`, as users run it: real launcher, real rank processes.
// Failure of one rank stops the group and is reported; signals to the
// launcher leave no process behind; restarts; two launchers as two nodes;
// bad arguments; per-rank log files.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "common/clock.h"
#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::EnvMap;
using testing::ProcessRanks;
using testing::RankResult;

// The test process adopts orphans, so a rank that outlived its launcher
// would be found (and reaped) here rather than vanish from view.
const bool kSubreaper = [] { return ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }();

using testing::gone;
using testing::TempDir;

// The launcher under test, running `args`.
class Launcher : public testing::Launcher {
 public:
  Launcher(std::vector<std::string> args, EnvMap env = {}) : testing::Launcher(LOCKSTEP_CLI, std::move(args), std::move(env)) {}
  RankResult wait(Duration d = 60s) { return testing::Launcher::wait(d); }
};

std::vector<std::string> program(const std::string& mode) { return {"--", RANK_PROGRAM, mode}; }

std::vector<pid_t> rank_pids(const std::string& dir, int n, Duration timeout = 20s) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const std::string file = dir + "/rank" + std::to_string(r) + ".pid";
    EXPECT_TRUE(testing::wait_for_file(file, timeout)) << file;
    std::this_thread::sleep_for(20ms);
    pid_t pid = 0;
    std::ifstream(file) >> pid;
    pids.push_back(pid);
  }
  return pids;
}

void expect_all_gone(const std::vector<pid_t>& pids, Duration within = 5s) {
  const Deadline deadline = Deadline::after(within);
  for (pid_t pid : pids) {
    while (!gone(pid) && !deadline.expired()) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(gone(pid)) << "rank process " << pid << " is still running";
  }
}

using testing::contains;

TEST(Launcher, StartsEveryRankWithTheTorchrunEnvironment) {
  auto args = std::vector<std::string>{"--nproc-per-node", "3"};
  auto p = program("ok");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args);
  const auto r = launcher.wait();
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(r.output, "[" + std::to_string(rank) + "] rank " + std::to_string(rank) + " of 3 sum 6"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "(local rank " + std::to_string(rank) + " of 3, node 0)")) << r.output;
  }
}

TEST(Launcher, AFailedRankStopsTheOthersAndIsReported) {
  TempDir dir;
  auto args = std::vector<std::string>{"--nproc-per-node", "3", "--grace-period", "2"};
  auto p = program("fail");
  args.insert(args.end(), p.begin(), p.end());
  const auto start = Clock::now();
  Launcher launcher(args, {{"FAIL_RANK", "1"}, {"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 3);
  const auto r = launcher.wait();
  EXPECT_LT(seconds_between(start, Clock::now()), 10.0);
  EXPECT_EQ(r.exit_code, 3) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 failed first: exit code 3")) << r.output;
  EXPECT_TRUE(contains(r.output, "last lines of rank 1's stderr")) << r.output;
  EXPECT_TRUE(contains(r.output, "  | rank 1 failing on purpose")) << r.output;
  expect_all_gone(pids);
}

TEST(Launcher, SigtermToTheLauncherReachesEveryRank) {
  TempDir dir;
  auto args = std::vector<std::string>{"--nproc-per-node", "2", "--grace-period", "5"};
  auto p = program("sleep");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args, {{"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 2);
  launcher.signal(SIGTERM);
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "received SIGTERM, stopping all ranks")) << r.output;
  expect_all_gone(pids);
}

TEST(Launcher, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  TempDir dir;
  auto args = std::vector<std::string>{"--nproc-per-node", "2", "--grace-period", "1"};
  auto p = program("ignore-term");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args, {{"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 2);
  const auto start = Clock::now();
  launcher.signal(SIGINT);
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << testing::describe(r);
  EXPECT_LT(seconds_between(start, Clock::now()), 5.0);
  expect_all_gone(pids);
}

TEST(Launcher, KillingTheLauncherKillsItsRanks) {
  ASSERT_TRUE(kSubreaper);
  TempDir dir;
  auto args = std::vector<std::string>{"--nproc-per-node", "2"};
  auto p = program("sleep");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args, {{"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 2);
  launcher.signal(SIGKILL);
  launcher.wait(10s);
  expect_all_gone(pids);
}

TEST(Launcher, RestartsTheGroupAfterAFailure) {
  auto args = std::vector<std::string>{"--nproc-per-node", "2", "--max-restarts", "2"};
  auto p = program("restart");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args);
  const auto r = launcher.wait();
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 failed first: exit code 5")) << r.output;
  EXPECT_TRUE(contains(r.output, "restarting all ranks (restart 1 of 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 attempt 1 starting")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0 of 2 sum 3")) << r.output;
}

TEST(Launcher, GivesUpWhenRestartsRunOut) {
  auto args = std::vector<std::string>{"--nproc-per-node", "2", "--max-restarts", "1"};
  auto p = program("always-fail");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args);
  const auto r = launcher.wait();
  EXPECT_EQ(r.exit_code, 4) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 attempt 1 starting")) << r.output;
  EXPECT_FALSE(contains(r.output, "restart 2 of 1")) << r.output;
}

TEST(Launcher, TwoLaunchersFormOneJobAsTwoNodes) {
  const std::string port = std::to_string(testing::free_port());
  const auto node = [&](int rank, int nproc) {
    auto args = std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(rank), "--nproc-per-node",
                                         std::to_string(nproc), "--master-addr", "127.0.0.1", "--master-port", port};
    auto p = program("ok");
    args.insert(args.end(), p.begin(), p.end());
    return args;
  };
  Launcher first(node(0, 2), {{"LOCKSTEP_BACKEND", "tcp"}});
  Launcher second(node(1, 1), {{"LOCKSTEP_BACKEND", "tcp"}});
  const auto a = first.wait(), b = second.wait();
  EXPECT_EQ(a.exit_code, 0) << testing::describe(a);
  EXPECT_EQ(b.exit_code, 0) << testing::describe(b);
  EXPECT_TRUE(contains(a.output, "[0] rank 0 of 3 sum 6")) << a.output;
  EXPECT_TRUE(contains(a.output, "[1] rank 1 of 3 sum 6")) << a.output;
  EXPECT_TRUE(contains(b.output, "[2] rank 2 of 3 sum 6")) << b.output;
  EXPECT_TRUE(contains(b.output, "(local rank 0 of 1, node 1)")) << b.output;
}

TEST(Launcher, AFailureOnOneNodeStopsTheOtherNode) {
  TempDir dir;
  const std::string port = std::to_string(testing::free_port());
  const auto node = [&](int rank) {
    auto args = std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(rank), "--nproc-per-node", "1",
                                         "--master-port", port, "--grace-period", "1"};
    auto p = program("fail");
    args.insert(args.end(), p.begin(), p.end());
    return args;
  };
  Launcher first(node(0), {{"FAIL_RANK", "1"}, {"PID_DIR", dir.path()}});
  Launcher second(node(1), {{"FAIL_RANK", "1"}, {"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 2);
  const auto a = first.wait(30s), b = second.wait(30s);
  EXPECT_EQ(b.exit_code, 3) << testing::describe(b);
  EXPECT_NE(a.exit_code, 0) << testing::describe(a);
  EXPECT_TRUE(contains(a.output, "another node reported: rank 1 on node 1 failed")) << a.output;
  expect_all_gone(pids);
}

TEST(Launcher, WritesEachRanksOutputToTheLogDirectory) {
  TempDir dir;
  auto args = std::vector<std::string>{"--nproc-per-node", "2", "--log-dir", dir.path() + "/logs"};
  auto p = program("ok");
  args.insert(args.end(), p.begin(), p.end());
  Launcher launcher(args);
  EXPECT_EQ(launcher.wait().exit_code, 0);
  for (int r = 0; r < 2; ++r) {
    std::ifstream log(dir.path() + "/logs/rank" + std::to_string(r) + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(contains(text, "rank " + std::to_string(r) + " of 2 sum 3")) << text;
  }
}

TEST(Launcher, BadArgumentsAreClearErrors) {
  const auto run = [](std::vector<std::string> args) {
    Launcher launcher(std::move(args));
    return launcher.wait(20s);
  };
  auto r = run({"--nnodes", "2", "--node-rank", "2", "--master-port", "1234", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "--node-rank 2 is not below --nnodes 2")) << r.output;
  r = run({"--nnodes", "2", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "fixed --master-port")) << r.output;
  r = run({"--nproc-per-node", "zero", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "'zero' is not a positive number")) << r.output;
  r = run({"--nproc-per-node", "1", "--", "/nonexistent/program"});
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_TRUE(contains(r.output, "cannot execute /nonexistent/program")) << r.output;
  r = run({"--nproc-per-node", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "program is required")) << r.output;
}

// Shared-memory segments in /dev/shm created by any of `pids` (lockstep's
// segment names end with the creator's pid).
std::vector<std::string> segments_of(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("lockstep.", 0) != 0) continue;
    for (pid_t pid : pids)
      if (name.substr(name.rfind('.') + 1) == std::to_string(pid)) found.push_back(name);
  }
  return found;
}

// A rank killed while the others set up shared memory used to leave their
// segments in /dev/shm: a survivor blocked in set-up is stopped by the
// launcher before it can unlink what it created. The launcher removes its
// job's segments, and only those (a segment of another job stays).
TEST(Launcher, ARankKilledDuringShmSetUpLeavesNothingInDevShm) {
  const std::string other_job = "/dev/shm/lockstep.otherjob.r0." + std::to_string(::getpid());
  std::ofstream{other_job};
  for (const std::string mode : {"die-in-shm-setup", "die-in-shared-alloc"}) {
    for (int trial = 0; trial < 3; ++trial) {
      TempDir dir;
      Launcher launcher({"--nproc-per-node", "2", "--grace-period", "2", "--", RANK_PROGRAM, mode},
                        {{"PID_DIR", dir.path()}, {"LOCKSTEP_BACKEND", "shm"}, {"LOCKSTEP_CONNECT_TIMEOUT", "30"}});
      const auto pids = rank_pids(dir.path(), 2);
      const auto r = launcher.wait(30s);
      EXPECT_EQ(r.exit_code, 128 + SIGKILL) << mode << ": " << testing::describe(r);
      EXPECT_TRUE(contains(r.output, "rank 1 failed first: killed by signal 9")) << mode << ": " << r.output;
      expect_all_gone(pids);
      EXPECT_EQ(segments_of(pids), std::vector<std::string>{}) << mode << ", trial " << trial;
    }
  }
  EXPECT_TRUE(std::filesystem::exists(other_job)) << "the launcher removed another job's segment";
  std::filesystem::remove(other_job);
}

// Rank 1 exits 0 after one all-reduce; rank 0 waits for it in a second one.
// Rank 0's error must say rank 1 left (not that it crashed), and the
// launcher must name rank 1, not the healthy rank 0, as the likely cause.
TEST(Launcher, ARankThatExitsCleanlyTooEarlyIsNamedAsTheCause) {
  for (const std::string backend : {"shm", "tcp"}) {
    Launcher launcher({"--nproc-per-node", "2", "--", RANK_PROGRAM, "leave-early"}, {{"LOCKSTEP_BACKEND", backend}});
    const auto r = launcher.wait(60s);
    EXPECT_EQ(r.exit_code, 2) << backend << ": " << testing::describe(r);
    EXPECT_TRUE(contains(r.output, "rank 1 leaving early")) << r.output;
    EXPECT_TRUE(contains(r.output, "rank 1 left the group")) << backend << ": " << r.output;
    EXPECT_FALSE(contains(r.output, "lost rank 1")) << backend << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "rank 1 exited cleanly (exit code 0) while the other ranks still ran")) << r.output;
    EXPECT_TRUE(contains(r.output, "likely cause: rank 1")) << r.output;
  }
}

// A launcher waiting for the other nodes (or for node 0's store) used to
// ignore Ctrl-C and SIGTERM until --rdzv-timeout ran out.
TEST(Launcher, SignalsStopALauncherWaitingForOtherNodes) {
  const std::string port = std::to_string(testing::free_port());
  for (const auto& [node_rank, sig] : {std::pair{0, SIGINT}, std::pair{1, SIGTERM}}) {
    Launcher launcher({"--nnodes", "2", "--node-rank", std::to_string(node_rank), "--master-port", port,
                       "--rdzv-timeout", "60", "--", RANK_PROGRAM, "ok"});
    std::this_thread::sleep_for(1s);
    const auto start = Clock::now();
    launcher.signal(sig);
    const auto r = launcher.wait(30s);
    EXPECT_LT(seconds_between(start, Clock::now()), 3.0) << "node " << node_rank;
    EXPECT_EQ(r.exit_code, 128 + sig) << "node " << node_rank << ": " << testing::describe(r);
    EXPECT_TRUE(contains(r.output, fmt::format("received SIG{} while waiting for", sigabbrev_np(sig))))
        << "node " << node_rank << ": " << r.output;
  }
}

// A sweep from 64 MiB down to 4 bytes used to print no rows and exit 0. It
// is refused before any rank starts, with -np as under a launcher.
TEST(Bench, ASmallestSizeAboveTheLargestIsAClearError) {
  for (const std::vector<std::string> args : {std::vector<std::string>{"bench", "--np", "1", "-b", "64M", "-e", "4"},
                                              std::vector<std::string>{"bench", "-b", "64M", "-e", "4"}}) {
    const auto r = testing::run_program(LOCKSTEP_CLI, args, {}, 30s);
    EXPECT_EQ(r.exit_code, 2) << testing::describe(r);
    EXPECT_TRUE(contains(r.output, "-b 64M (67108864 bytes) is larger than -e 4 (4 bytes)")) << r.output;
    EXPECT_FALSE(contains(r.output, "# lockstep bench:")) << r.output;
  }
  const auto r = testing::run_program(LOCKSTEP_CLI, {"bench", "--np", "1", "-b", "0", "-e", "4K"}, {}, 30s);
  EXPECT_EQ(r.exit_code, 2) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "-b 0 would never grow")) << r.output;
}

// A lockstep error in an example's main used to escape it: terminate(),
// SIGABRT and a core instead of the message.
TEST(Examples, AConfigErrorIsPrintedAndExitsTwo) {
  const auto r = testing::run_program(ALLREDUCE_DEMO, {}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}, 30s);
  EXPECT_EQ(r.signal, 0) << testing::describe(r);
  EXPECT_EQ(r.exit_code, 2) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "allreduce_demo: MASTER_ADDR is not set")) << r.output;
}

}  // namespace
}  // namespace lockstep
