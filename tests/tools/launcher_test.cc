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
#include "harness/reserved_port.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "store/store_token.h"

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
  // Ranks that ignore SIGTERM would run until the test kills them (30 s);
  // the bound leaves a loaded machine room beyond the 1 s grace period.
  EXPECT_LT(seconds_between(start, Clock::now()), 20.0);
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
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
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

// Node `rank` of a job of `nnodes` fixed nodes on this machine, one rank
// each, with the store at `port`; `more` follows (options, "--", program).
std::vector<std::string> one_rank_node(const std::string& port, int nnodes, int rank, std::vector<std::string> more) {
  std::vector<std::string> args{"--nnodes", std::to_string(nnodes), "--node-rank", std::to_string(rank),
                                "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Two nodes started with the same --node-rank (node 0 hosts the store on
// this one machine, so the duplicate is node 1): every launcher stops at
// once naming the two, instead of waiting for the node nobody started.
TEST(Launcher, ANodeRankGivenToTwoLaunchersStopsEveryNodeNamingBoth) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  const auto node = [&](int rank) {
    return one_rank_node(port, 3, rank, {"--rdzv-timeout", "30", "--", RANK_PROGRAM, "ok"});
  };
  const auto start = Clock::now();
  Launcher host(node(0), {{"LOCKSTEP_BACKEND", "tcp"}});
  Launcher one(node(1), {{"LOCKSTEP_BACKEND", "tcp"}});
  Launcher other(node(1), {{"LOCKSTEP_BACKEND", "tcp"}});
  const auto results = {host.wait(40s), one.wait(40s), other.wait(40s)};
  EXPECT_LT(seconds_between(start, Clock::now()), 15.0) << "a launcher waited for --rdzv-timeout";
  for (const auto& r : results) {
    EXPECT_NE(r.exit_code, 0) << testing::describe(r);
    EXPECT_TRUE(contains(r.output, "--node-rank 1 was given to two launchers, host ")) << r.output;
    EXPECT_FALSE(contains(r.output, "rank 0 of")) << "a rank ran: " << r.output;
  }
}

// Node 1 killed, launcher and rank, under the restart: started again with
// the same command, it joins the attempt the others' restart waits in (its
// node rank is held in attempt 0 by the launcher that died), with their
// restart count, and the job ends.
TEST(Launcher, ANodeStartedAgainAfterARestartJoinsTheAttemptTheRestartWaitsIn) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  const auto node = [&](int rank) {
    return one_rank_node(port, 2, rank, {"--max-restarts", "1", "--grace-period", "1", "--", RANK_PROGRAM, "loop-then-ok"});
  };
  const EnvMap env{{"LOCKSTEP_BACKEND", "tcp"}};
  Launcher host(node(0), env);
  auto first = std::make_unique<Launcher>(node(1), env);
  ASSERT_TRUE(host.wait_for_output("rank 0 attempt 0 starting", 40s)) << host.output_so_far();
  ASSERT_TRUE(first->wait_for_output("rank 1 attempt 0 starting", 40s)) << first->output_so_far();
  first->signal(SIGKILL);  // its rank dies with it (parent-death signal)
  first->wait(30s);
  Launcher again(node(1), env);
  const auto a = host.wait(60s), b = again.wait(60s);
  EXPECT_EQ(a.exit_code, 0) << testing::describe(a);
  EXPECT_EQ(b.exit_code, 0) << testing::describe(b);
  EXPECT_TRUE(contains(a.output, "restarting all ranks (restart 1 of 1)")) << a.output;
  EXPECT_TRUE(contains(a.output, "rank 0 of 2 sum 3")) << a.output;
  EXPECT_TRUE(contains(b.output, "rank 1 attempt 1 starting")) << b.output;
  EXPECT_TRUE(contains(b.output, "rank 1 of 2 sum 3")) << b.output;
}

// Node `rank` of a two-node job with the store at `port`, one rank,
// `options` and then `command`.
std::vector<std::string> node_running(const std::string& port, int rank, std::vector<std::string> options,
                                      const std::vector<std::string>& command) {
  options.push_back("--");
  options.insert(options.end(), command.begin(), command.end());
  return one_rank_node(port, 2, rank, options);
}

// Starts node 0 (its rank all-reduces until it fails, then ends as "ok"
// does) and node 1, whose rank sleeps instead of reaching its peer, and
// kills node 1's launcher (its rank with it) once the rank has started: no
// rank of node 0 fails, and nothing tells node 0 of the death.
std::unique_ptr<Launcher> node0_after_node1_killed_early(const std::string& port,
                                                         const std::vector<std::string>& options, const EnvMap& env) {
  auto host = std::make_unique<Launcher>(node_running(port, 0, options, {RANK_PROGRAM, "loop-then-ok"}), env);
  Launcher first(node_running(port, 1, options, {"/bin/sleep", "120"}), env);
  EXPECT_TRUE(host->wait_for_output("rank 0 attempt 0 starting", 40s)) << host->output_so_far();
  EXPECT_TRUE(first.wait_for_output("1 rank(s) on node 1 of 2", 40s)) << first.output_so_far();
  std::this_thread::sleep_for(500ms);  // its rank (sleep) started
  first.signal(SIGKILL);
  first.wait(30s);
  return host;
}

// Node 1 killed early, then started again: its launcher sees its
// predecessor's process gone and marks the attempt failed (the message
// says so, where the beats' limit, 15 s, would name a silent node), and
// node 0 restarts at once rather than after its rank's rendezvous times
// out (minutes).
TEST(Launcher, ANodeKilledBeforeItsRanksReachedTheirPeersIsRestartedByItsLauncherStartedAgain) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  const std::vector<std::string> options{"--max-restarts", "1", "--grace-period", "1"};
  const EnvMap env{{"LOCKSTEP_BACKEND", "tcp"}};
  auto host = node0_after_node1_killed_early(port, options, env);
  const auto start = Clock::now();
  Launcher again(node_running(port, 1, options, {RANK_PROGRAM, "loop-then-ok"}), env);
  const auto a = host->wait(60s), b = again.wait(60s);
  EXPECT_EQ(a.exit_code, 0) << testing::describe(a);
  EXPECT_EQ(b.exit_code, 0) << testing::describe(b);
  EXPECT_LT(seconds_between(start, Clock::now()), 45.0) << "node 0 waited for its rank's rendezvous to time out";
  EXPECT_TRUE(contains(a.output, "node 1's launcher (host ")) << a.output;
  EXPECT_TRUE(contains(a.output, "ended during attempt 0")) << a.output;
  EXPECT_TRUE(contains(a.output, "restarting all ranks (restart 1 of 1)")) << a.output;
  EXPECT_TRUE(contains(a.output, "rank 0 of 2 sum 3")) << a.output;
  EXPECT_TRUE(contains(b.output, "rank 1 of 2 sum 3")) << b.output;
}

// Node 1 killed early, and not started again: the launchers beat in the
// store under --on-rank-failure restart too, and node 0 fails the attempt
// once node 1 has been silent past the keep-alive limit (here 2 s) rather
// than when its rank's rendezvous times out (minutes), naming it.
TEST(Launcher, ANodeKilledBeforeItsRanksReachedTheirPeersFailsTheAttemptOnceItIsSilent) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  auto host = node0_after_node1_killed_early(
      port, {"--rdzv-conf", "keep_alive_interval=0.5,keep_alive_max_attempt=4", "--grace-period", "1"},
      {{"LOCKSTEP_BACKEND", "tcp"}});
  const auto start = Clock::now();
  const auto a = host->wait(40s);
  EXPECT_GT(a.exit_code, 0) << testing::describe(a);
  EXPECT_LT(seconds_between(start, Clock::now()), 20.0) << "node 0 waited for its rank's rendezvous to time out";
  EXPECT_TRUE(contains(a.output, "node 1 has not been heard from in the store for ")) << a.output;
}

TEST(Launcher, AFailureOnOneNodeStopsTheOtherNode) {
  TempDir dir;
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
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

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// torchrun's layout: DIR/<run id>/attempt_<k>/<local rank>/{stdout,stderr}.log,
// one directory per attempt (a restart does not append to the last one's).
TEST(Launcher, WritesEachRanksStreamsToTheLogDirectoryInTorchrunsLayout) {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  Launcher launcher({"--nproc-per-node", "2", "--max-restarts", "1", "--run-id", "job9", "--log-dir", logs, "--",
                     "/bin/sh", "-c",
                     "echo out $RANK $TORCHELASTIC_RESTART_COUNT; echo err $RANK >&2; "
                     "[ $TORCHELASTIC_RESTART_COUNT = 1 ] || [ $RANK = 0 ] || exit 3"});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  for (int attempt = 0; attempt < 2; ++attempt)
    for (int local = 0; local < 2; ++local) {
      const std::string rank_dir = fmt::format("{}/job9/attempt_{}/{}", logs, attempt, local);
      EXPECT_EQ(read_text(rank_dir + "/stdout.log"), fmt::format("out {} {}\n", local, attempt)) << rank_dir;
      EXPECT_EQ(read_text(rank_dir + "/stderr.log"), fmt::format("err {}\n", local)) << rank_dir;
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

// A rank killed while the others set up shared memory leaves nothing in
// /dev/shm: its regions and theirs have no names. Where regions do get names
// (ranks that may not open each other's descriptors), a survivor blocked in
// set-up is stopped by the launcher before it can unlink what it created:
// the launcher removes its job's segments, and only those (a segment of
// another job stays).
TEST(Launcher, ARankKilledDuringShmSetUpLeavesNothingInDevShm) {
  const std::string other_job = "/dev/shm/lockstep.otherjob.r0." + std::to_string(::getpid());
  std::ofstream{other_job};
  for (const std::string mode :
       {"die-in-shm-setup", "die-in-shared-alloc", "die-in-named-shm-setup", "die-in-named-shared-alloc"}) {
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
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  for (const auto& [node_rank, sig] : {std::pair{0, SIGINT}, std::pair{1, SIGTERM}}) {
    Launcher launcher({"--nnodes", "2", "--node-rank", std::to_string(node_rank), "--master-port", port,
                       "--rdzv-timeout", "60", "--", RANK_PROGRAM, "ok"});
    // Node 0 waits for the other node, node 1 for node 0's store; each
    // says so as it starts waiting.
    ASSERT_TRUE(launcher.wait_for_output("waiting for", 30s)) << "node " << node_rank;
    const auto start = Clock::now();
    launcher.signal(sig);
    const auto r = launcher.wait(30s);
    // Far below the 60 s --rdzv-timeout it used to wait out.
    EXPECT_LT(seconds_between(start, Clock::now()), 20.0) << "node " << node_rank;
    EXPECT_EQ(r.exit_code, 128 + sig) << "node " << node_rank << ": " << testing::describe(r);
    EXPECT_TRUE(contains(r.output, fmt::format("received SIG{} while waiting for", sigabbrev_np(sig))))
        << "node " << node_rank << ": " << r.output;
  }
}

// Every "-np" on the command line used to become "--np", also the
// program's own; and a program's options without "--" before its name
// were refused as the launcher's ("not expected: --foo").
TEST(Launcher, TheProgramsArgumentsArriveUnchanged) {
  for (const auto& args : {std::vector<std::string>{"--nproc-per-node", "1", "--", "/bin/echo", "hello", "-np", "3"},
                           std::vector<std::string>{"--nproc-per-node", "1", "/bin/echo", "hello", "-np", "3"},
                           std::vector<std::string>{"--nproc-per-node=1", "--no-prefix", "/bin/echo", "hello", "-np",
                                                    "3"}}) {
    Launcher launcher(args);
    const auto r = launcher.wait(30s);
    EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
    EXPECT_TRUE(contains(r.output, "hello -np 3\n")) << r.output;
  }
  Launcher launcher({"--nproc-per-node", "2", "/bin/echo", "--foo", "--nproc-per-node", "9", "--", "x"});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "[1] --foo --nproc-per-node 9 -- x\n")) << r.output;
}

TEST(Launcher, SetsTheTorchrunVariablesAsTorchrunDoes) {
  Launcher launcher({"--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-id", "job7", "--", "/bin/sh", "-c",
                     "echo RANK=$RANK LOCAL=$LOCAL_RANK/$LOCAL_WORLD_SIZE WORLD=$WORLD_SIZE ROLE=$ROLE_NAME:$ROLE_RANK/"
                     "$ROLE_WORLD_SIZE GROUP=$GROUP_RANK/$GROUP_WORLD_SIZE RUN=$TORCHELASTIC_RUN_ID "
                     "RESTART=$TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS"});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_TRUE(contains(r.output, fmt::format("[{0}] RANK={0} LOCAL={0}/2 WORLD=2 ROLE=default:{0}/2 GROUP=0/1 "
                                               "RUN=job7 RESTART=0/2\n",
                                               rank)))
        << r.output;
}

// The ranks learn that their launchers replace ranks (so a survivor waits a
// moment for a dead rank's launcher to say whether it did) when they do
// (replacements need the continue mode: the launcher refuses them alone).
TEST(Launcher, TellsTheRanksWhetherItReplacesThem) {
  const auto replacements_seen = [](const std::vector<std::string>& options) {
    std::vector<std::string> args{"--nproc-per-node", "1"};
    args.insert(args.end(), options.begin(), options.end());
    for (const char* a : {"--", "/bin/sh", "-c", "echo REPLACEMENTS=$LOCKSTEP_MAX_REPLACEMENTS."}) args.push_back(a);
    const auto r = Launcher(args).wait(30s);
    EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
    return r.output;
  };
  EXPECT_TRUE(contains(replacements_seen({"--on-rank-failure", "continue", "--max-replacements", "3"}),
                       "[0] REPLACEMENTS=3.\n"));
  EXPECT_TRUE(contains(replacements_seen({"--on-rank-failure", "continue"}), "[0] REPLACEMENTS=.\n"));
}

TEST(Launcher, TeeAndRedirectsSendStreamsToTheLogDirectory) {
  TempDir dir;
  Launcher launcher({"--nproc-per-node", "1", "--run-id", "tee", "--log-dir", dir.path(), "--redirects", "1", "--tee", "2", "--",
                     "/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2"});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_FALSE(contains(r.output, "to-stdout")) << "redirected stdout reached the console: " << r.output;
  EXPECT_TRUE(contains(r.output, "[0] to-stderr")) << r.output;
  EXPECT_EQ(read_text(dir.path() + "/tee/attempt_0/0/stdout.log"), "to-stdout\n");
  EXPECT_EQ(read_text(dir.path() + "/tee/attempt_0/0/stderr.log"), "to-stderr\n");
  const auto bad = Launcher({"--nproc-per-node", "1", "--tee", "3", "--", "true"}).wait(30s);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.output, "add --log-dir")) << bad.output;
}

// The store of a job on several nodes listens beyond loopback; it must
// refuse a client without the job's token. Every node derives the token
// from its --rdzv-id (and LOCKSTEP_STORE_TOKEN, when set), so a node of
// another job, or with another secret, is refused too.
TEST(Launcher, TheStoreOfSeveralNodesRefusesAClientWithoutTheToken) {
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  const auto node = [&](int rank, const std::string& id) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr", "127.0.0.1",
                                    "--master-port", std::to_string(port), "--rdzv-id", id, "--rdzv-timeout", "20",
                                    "--", RANK_PROGRAM, "ok"};
  };
  Launcher first(node(0, "job-a"));
  TcpStoreOptions tokenless;
  tokenless.connect_timeout = 10s;
  try {
    TcpStore client("127.0.0.1", static_cast<std::uint16_t>(port), tokenless);
    client.get("launcher/run_id");
    ADD_FAILURE() << "a client without a token was served";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "refused this client: wrong store token")) << e.what();
  }
  const auto stranger = Launcher(node(1, "job-b")).wait(30s);
  EXPECT_EQ(stranger.exit_code, 2) << testing::describe(stranger);
  EXPECT_TRUE(contains(stranger.output, "wrong store token")) << stranger.output;
  const auto other_secret = Launcher(node(1, "job-a"), {{"LOCKSTEP_STORE_TOKEN", "another"}}).wait(30s);
  EXPECT_EQ(other_secret.exit_code, 2) << testing::describe(other_secret);
  EXPECT_TRUE(contains(other_secret.output, "wrong store token")) << other_secret.output;
  Launcher second(node(1, "job-a"));
  const auto a = first.wait(30s), b = second.wait(30s);
  EXPECT_EQ(a.exit_code, 0) << testing::describe(a);
  EXPECT_EQ(b.exit_code, 0) << testing::describe(b);
  EXPECT_TRUE(contains(b.output, "rank 1 of 2 sum 3")) << b.output;
}

// A store other hosts can reach is never guarded by a token anyone can
// compute: without LOCKSTEP_STORE_TOKEN the launcher refuses to start; with
// it, a client holding the token lockstep used to derive from --rdzv-id
// (what every command line shows) is refused.
TEST(Launcher, AStoreOtherHostsCanReachNeedsTheUsersSecret) {
  const std::string address = testing::reachable_address();
  if (address.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 address";
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  const auto node = [&](int rank) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr", address,
                                    "--master-port", std::to_string(port), "--rdzv-id", "job-a", "--rdzv-timeout",
                                    "20", "--", RANK_PROGRAM, "ok"};
  };
  const auto unprotected = Launcher(node(0), {{"LOCKSTEP_STORE_TOKEN", ""}}).wait(30s);
  EXPECT_EQ(unprotected.exit_code, 2) << testing::describe(unprotected);
  EXPECT_TRUE(contains(unprotected.output, "reachable from other hosts and nothing would protect it: set "
                                           "LOCKSTEP_STORE_TOKEN"))
      << unprotected.output;
  const EnvMap secret{{"LOCKSTEP_STORE_TOKEN", "only-the-nodes-know"}};
  Launcher first(node(0), secret);
  for (const std::string& token : {std::string(), shared_store_token(std::nullopt, "id/job-a")}) {
    TcpStoreOptions guesser;
    guesser.token = token;
    guesser.connect_timeout = 10s;
    try {
      TcpStore client(address, static_cast<std::uint16_t>(port), guesser);
      client.get("launcher/run_id");
      ADD_FAILURE() << "a client with token '" << token << "' was served";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "wrong store token")) << e.what();
    }
  }
  Launcher second(node(1), secret);
  const auto a = first.wait(30s), b = second.wait(30s);
  EXPECT_EQ(a.exit_code, 0) << testing::describe(a);
  EXPECT_EQ(b.exit_code, 0) << testing::describe(b);
  EXPECT_TRUE(contains(a.output, "(protected by LOCKSTEP_STORE_TOKEN)")) << a.output;
}

// A launcher interrupted while the nodes gather used to leave the others
// waiting until --rdzv-timeout; now they stop at once and name it, whether
// it hosts the store or not, in fixed and in elastic jobs.
TEST(Launcher, ALauncherInterruptedDuringTheRendezvousStopsTheOthers) {
  struct Case {
    std::vector<std::string> nodes;  // --nnodes
    bool elastic;
    int interrupted;  // which of the two launchers (0 hosts the store)
    std::string named;
  };
  for (const Case& c : {Case{{"--nnodes", "3"}, false, 1, "node 1 (host "}, Case{{"--nnodes", "3"}, false, 0, "node 0 (host "},
                        Case{{"--nnodes", "3:4"}, true, 1, "the node on host "}}) {
    const testing::ReservedPort reserved_port;
    const std::string port = reserved_port.text();
    std::vector<std::unique_ptr<Launcher>> launchers;
    for (int n = 0; n < 2; ++n) {
      std::vector<std::string> args = c.nodes;
      if (c.elastic) {
        args.insert(args.end(), {"--rdzv-endpoint", "127.0.0.1:" + port});
      } else {
        args.insert(args.end(), {"--node-rank", std::to_string(n), "--master-port", port});
      }
      args.insert(args.end(), {"--rdzv-id", "gather", "--rdzv-timeout", "60", "--", RANK_PROGRAM, "ok"});
      launchers.push_back(std::make_unique<Launcher>(args));
      // The first one hosts the store; each says when it waits for the
      // others (having joined the store).
      ASSERT_TRUE(launchers.back()->wait_for_output(
          c.elastic ? "; waiting for the nodes of rendezvous" : "is waiting for the other", 30s))
          << c.named << " launcher " << n;
    }
    const auto start = Clock::now();
    launchers[static_cast<std::size_t>(c.interrupted)]->signal(SIGINT);
    const auto other = launchers[static_cast<std::size_t>(1 - c.interrupted)]->wait(30s);
    const auto interrupted = launchers[static_cast<std::size_t>(c.interrupted)]->wait(30s);
    EXPECT_LT(seconds_between(start, Clock::now()), 20.0) << c.named << ": far below the 60 s --rdzv-timeout";
    EXPECT_EQ(interrupted.exit_code, 128 + SIGINT) << testing::describe(interrupted);
    EXPECT_NE(other.exit_code, 0) << testing::describe(other);
    EXPECT_TRUE(contains(other.output, c.named)) << other.output;
    EXPECT_TRUE(contains(other.output, "was interrupted: received SIGINT while waiting for")) << other.output;
  }
}

// --nnodes MIN:MAX on one machine (the hosts are launchers on loopback;
// tests/netns/elastic_test.sh runs them on separate hosts).
std::vector<std::string> elastic_node(const std::string& port, const std::string& mode,
                                      std::vector<std::string> extra = {}, const std::string& nnodes = "2:3") {
  // An id of this test process: a launcher of another test that got the
  // same port is refused (another token) rather than joining this job.
  std::vector<std::string> args{"--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + port,
                                "--rdzv-id", fmt::format("el-{}", ::getpid()), "--rdzv-conf", "last_call_timeout=1", "--grace-period", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--", RANK_PROGRAM, mode});
  return args;
}

TEST(Launcher, AnElasticJobBelowItsMinimumFailsClearlyAtTheDeadline) {
  const auto start = Clock::now();
  const auto r = Launcher(elastic_node(testing::ReservedPort().text(), "ok", {"--rdzv-timeout", "2"})).wait(30s);
  EXPECT_LT(seconds_between(start, Clock::now()), 20.0) << "--rdzv-timeout 2: at that deadline, not much later";
  EXPECT_EQ(r.exit_code, 2) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "only 1 node(s)")) << r.output;
  EXPECT_TRUE(contains(r.output, "fewer than the minimum of 2 (--nnodes 2:3)")) << r.output;
  EXPECT_FALSE(contains(r.output, "attempt 0 starting")) << "a rank started: " << r.output;
}

// torchrun's multi-node form: --nnodes 2:2 with an endpoint and an id, no
// --rdzv-backend and no --node-rank. The rendezvous numbers the nodes (it
// once ran as a static job where both launchers took node 0).
TEST(Launcher, MinEqualToMaxIsTheElasticRendezvous) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  const std::vector<std::string> args{"--nnodes", "2:2", "--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-id",
                                      fmt::format("mm-{}", ::getpid()), "--", RANK_PROGRAM, "ok"};
  Launcher first(args, {{"LOCKSTEP_BACKEND", "tcp"}});
  Launcher second(args, {{"LOCKSTEP_BACKEND", "tcp"}});
  const auto a = first.wait(60s), b = second.wait(60s);
  EXPECT_EQ(a.exit_code, 0) << testing::describe(a);
  EXPECT_EQ(b.exit_code, 0) << testing::describe(b);
  const std::string all = a.output + b.output;
  EXPECT_TRUE(contains(all, "on node 0 of 2")) << all;
  EXPECT_TRUE(contains(all, "on node 1 of 2")) << all;
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(contains(all, fmt::format("rank {} of 2 sum 3", rank))) << all;
}

TEST(Launcher, AnElasticJobRanksItsNodesAndRestartsAfterAFailure) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  std::vector<std::unique_ptr<Launcher>> nodes;
  // 3:3: every round waits for all three, however slowly a launcher starts
  // or stops its ranks on a busy machine.
  for (int n = 0; n < 3; ++n)
    nodes.push_back(std::make_unique<Launcher>(elastic_node(port, "restart", {"--max-restarts", "1"}, "3:3"),
                                               EnvMap{{"LOCKSTEP_BACKEND", "tcp"}}));
  std::string all;
  for (auto& node : nodes) {
    const auto r = node->wait(60s);
    EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
    all += r.output;
  }
  // Round 0: rank 1 fails; round 1: all three nodes again, every rank done.
  EXPECT_TRUE(contains(all, "rank 1 failed first: exit code 5")) << all;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(all, fmt::format("rank {} attempt 1 starting", rank))) << all;
    EXPECT_TRUE(contains(all, fmt::format("rank {} of 3 sum 6", rank))) << all;
  }
  EXPECT_TRUE(contains(all, fmt::format("(world size 3), store 127.0.0.1:{} (loopback only, token derived from the "
                                        "job), run el-{}, round 1",
                                        port, ::getpid())))
      << all;
}

TEST(Launcher, AnElasticJobGrowsWhenANodeArrives) {
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  std::vector<std::unique_ptr<Launcher>> nodes;
  for (int n = 0; n < 2; ++n)
    nodes.push_back(std::make_unique<Launcher>(elastic_node(port, "sleep"), EnvMap{{"LOCKSTEP_BACKEND", "tcp"}}));
  // Two nodes run a world of 2 before the third starts. Under load the
  // first two took longer than the wait once, the third was started anyway
  // and all three formed round 0 together (no growth to test): the job of
  // two must be there first, or the test stops and says so.
  for (auto& node : nodes) {
    ASSERT_TRUE(node->wait_for_output("(world size 2)", 90s) && node->wait_for_output("attempt 0 starting", 90s))
        << "the first two nodes did not form a world of 2: " << node->output_so_far();
  }
  nodes.push_back(std::make_unique<Launcher>(elastic_node(port, "sleep"), EnvMap{{"LOCKSTEP_BACKEND", "tcp"}}));
  for (auto& node : nodes) EXPECT_TRUE(node->wait_for_output("(world size 3)", 90s));
  for (auto& node : nodes) node->signal(SIGTERM);
  std::string all;
  for (auto& node : nodes) all += node->wait(30s).output;
  EXPECT_TRUE(contains(all, "a new node is waiting to join; stopped this node's 1 rank(s)")) << all;
  EXPECT_TRUE(contains(all, "on node 2 of 3 (world size 3)")) << all;
}

// A re-form for a node that joins is planned: ranks that see a peer go
// while in a collective say the launcher stopped them on purpose, and no
// rank reports a lost peer or writes a flight-recorder dump.
TEST(Launcher, ARankStoppedForARegroupSaysItWasPlanned) {
  TempDir flight;
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  const EnvMap env{{"LOCKSTEP_BACKEND", "tcp"}, {"LOCKSTEP_FLIGHT_DIR", flight.path()}};
  std::vector<std::unique_ptr<Launcher>> nodes;
  for (int n = 0; n < 2; ++n) nodes.push_back(std::make_unique<Launcher>(elastic_node(port, "allreduce-loop"), env));
  for (auto& node : nodes) EXPECT_TRUE(node->wait_for_output("attempt 0 starting", 40s));  // two nodes all-reduce
  nodes.push_back(std::make_unique<Launcher>(elastic_node(port, "allreduce-loop"), env));
  // Until every node runs the re-formed group: what the stopped ranks said
  // is in by then (a launcher starts the next round once they are reaped).
  for (auto& node : nodes) EXPECT_TRUE(node->wait_for_output("(world size 3)", 40s));
  std::string all;
  for (auto& node : nodes) all += node->output_so_far();
  const bool no_dumps = std::filesystem::is_empty(flight.path());
  for (auto& node : nodes) node->signal(SIGKILL);  // the launcher's ranks die with it (parent-death signal)
  for (auto& node : nodes) node->wait(30s);
  EXPECT_TRUE(contains(all, "a new node is waiting to join; stopped this node's 1 rank(s)")) << all;
  EXPECT_TRUE(contains(all, "stopped by the launcher on purpose (a node joins the job; re-forming the group), not a "
                            "failure"))
      << all;
  EXPECT_FALSE(contains(all, "flight recorder")) << all;
  EXPECT_TRUE(no_dumps) << "a planned stop wrote flight-recorder dumps";
}

// The store lives in one launcher (the first at the endpoint); losing it
// ends the job, and the others say so rather than hang.
TEST(Launcher, AnElasticJobEndsWhenTheNodeHostingTheStoreDies) {
  TempDir dir;
  const testing::ReservedPort reserved_port;
  const std::string port = reserved_port.text();
  Launcher host(elastic_node(port, "sleep", {"--max-restarts", "2"}), {{"PID_DIR", dir.path()}});
  // Joined, so it hosts the store (the first launcher at the endpoint does).
  ASSERT_TRUE(host.wait_for_output("; waiting for the nodes of rendezvous", 30s));
  Launcher other(elastic_node(port, "sleep", {"--max-restarts", "2"}), {{"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 2);  // both nodes' ranks run
  const auto start = Clock::now();
  host.signal(SIGKILL);
  const auto r = other.wait(30s);
  EXPECT_LT(seconds_between(start, Clock::now()), 25.0) << "it waited for a store that is gone";
  EXPECT_NE(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "the store at 127.0.0.1:" + port + " is gone")) << r.output;
  EXPECT_TRUE(contains(r.output, "the node that hosted it has left")) << r.output;
  expect_all_gone(pids);
  host.wait(10s);
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

// The error a rank records in TORCHELASTIC_ERROR_FILE (lockstep::record_error,
// or PyTorch's @record) is quoted in the launcher's report, as torchrun does.
TEST(Launcher, ARanksErrorFileIsQuotedInTheReport) {
  Launcher launcher({"--nproc-per-node", "2", "--grace-period", "1", "--", RANK_PROGRAM, "record-error"});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 4) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 recorded its error (")) << r.output;
  EXPECT_TRUE(contains(r.output, "/attempt_0/1/error.json): lockstep.ConfigError: rank 1 gave up on purpose"))
      << r.output;
}

// The rank that recorded its error first is the cause, even when a peer
// that failed because of it exits sooner: rank 1 records its error and
// takes 0.3 s to exit, rank 0 fails soon after it sees that file (0.05 s:
// files written within one kernel tick carry the same time, and then the
// first exit decides). A PyTorch rank raising under @record and the gloo
// peer that loses it race like this.
TEST(Launcher, TheFirstRecordedErrorNamesTheCauseNotTheFirstExit) {
  const std::string script =
      "if [ \"$RANK\" = 1 ]; then echo '{\"message\": \"rank 1 broke first\"}' > \"$TORCHELASTIC_ERROR_FILE\"; "
      "sleep 0.3; exit 3; fi; "
      "peer=$(dirname \"$TORCHELASTIC_ERROR_FILE\")/../1/error.json; "
      "while [ ! -e \"$peer\" ]; do sleep 0.01; done; sleep 0.05; "
      "echo '{\"message\": \"rank 0 lost rank 1\"}' > \"$TORCHELASTIC_ERROR_FILE\"; exit 4";
  Launcher launcher({"--nproc-per-node", "2", "--grace-period", "1", "--", "/bin/sh", "-c", script});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 3) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 failed first")) << r.output;
  EXPECT_TRUE(contains(r.output, "/attempt_0/1/error.json): rank 1 broke first")) << r.output;
}

// Without --log-dir the error files live in a temporary directory, removed
// at exit; one left by a launcher killed with SIGKILL is removed by the next.
TEST(Launcher, AKilledLaunchersScratchDirectoryIsRemovedByTheNext) {
  Launcher killed({"--nproc-per-node", "1", "--", "/bin/sh", "-c", "echo file=$TORCHELASTIC_ERROR_FILE; sleep 60"});
  ASSERT_TRUE(killed.wait_for_output("error.json", 30s)) << killed.output_so_far();
  const std::string out = killed.output_so_far();
  const auto at = out.find("file=") + 5;
  const std::filesystem::path file = out.substr(at, out.find('\n', at) - at);
  const std::filesystem::path scratch = file.parent_path().parent_path().parent_path().parent_path();
  EXPECT_EQ(scratch.filename().string().rfind("lockstep-run-", 0), 0u) << scratch;
  killed.signal(SIGKILL);
  killed.wait(30s);
  EXPECT_TRUE(std::filesystem::exists(scratch)) << scratch;
  const auto next = Launcher({"--nproc-per-node", "1", "--", "true"}).wait(30s);
  EXPECT_EQ(next.exit_code, 0) << testing::describe(next);
  EXPECT_FALSE(std::filesystem::exists(scratch)) << scratch << " outlived its launcher";
}

// torchrun's entry points: a .py file runs with python3 -u, -m runs a
// module, --run-path a file through runpy, --no-python the program as it is.
TEST(Launcher, PythonProgramsStartAsUnderTorchrun) {
  const std::string dir = PYTHON_PROGRAMS;
  const auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--nproc-per-node", "2"});
    return Launcher(args, {{"PYTHONPATH", dir}}).wait(60s);
  };
  auto r = run({dir + "/show_argv.py", "--lr", "1"});
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "[1] rank 1 ran show_argv.py as __main__ with ['--lr', '1']")) << r.output;
  r = run({"-m", "show_argv", "x"});
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "[0] rank 0 ran show_argv.py as __main__ with ['x']")) << r.output;
  r = run({"--run-path", dir + "/show_argv.py", "y", "z"});
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "[1] rank 1 ran show_argv.py as __main__ with ['y', 'z']")) << r.output;
  r = run({"--no-python", dir + "/shell_named_py.py", "w"});
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "[1] rank 1 ran as a shell script with w")) << r.output;
  r = run({dir + "/shell_named_py.py"});  // a .py file goes to Python, which cannot read a shell script
  EXPECT_NE(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "SyntaxError")) << r.output;
  r = run({"-m", "--no-python", "show_argv"});
  EXPECT_EQ(r.exit_code, 2) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "drop one")) << r.output;
}

// A torch.distributed program (gloo, env://) runs unchanged: MASTER_ADDR
// and MASTER_PORT are its own, as under torchrun's c10d rendezvous (its
// rank 0 listens there; the launcher's store is elsewhere), with PyTorch
// 1.13 (Debian's python3) and 2.x (the project's virtual environment).
TEST(Launcher, ATorchDistributedProgramRunsUnchanged) {
  const std::string program = std::string(PYTHON_PROGRAMS) + "/gloo_allreduce.py";
  int pythons = 0;
  for (const std::string python : {std::string("/usr/bin/python3"), std::string(TORCH2_PYTHON)}) {
    if (testing::run_program(python, {"-c", "import torch.distributed"}, {}, 60s).exit_code != 0) continue;
    ++pythons;
    // `python3` in PATH is what runs a .py file: the interpreter's own directory first.
    const EnvMap env{{"PATH", std::filesystem::path(python).parent_path().string() + ":/usr/bin:/bin"}};
    auto r = Launcher({"--nproc-per-node", "3", "--grace-period", "2", program}, env).wait(120s);
    EXPECT_EQ(r.exit_code, 0) << python << ": " << testing::describe(r);
    for (int rank = 0; rank < 3; ++rank)
      EXPECT_TRUE(contains(r.output, fmt::format("rank {} of 3: sum 6 (MASTER_ADDR=127.0.0.1", rank))) << r.output;
    EXPECT_TRUE(contains(r.output, "USE_AGENT_STORE=False")) << r.output;
    // PyTorch's @record writes the error file; the report quotes it.
    r = Launcher({"--nproc-per-node", "2", "--grace-period", "2", program, "--fail-rank", "1"}, env).wait(120s);
    EXPECT_NE(r.exit_code, 0) << python << ": " << testing::describe(r);
    EXPECT_TRUE(contains(r.output, "rank 1 recorded its error (")) << r.output;
    EXPECT_TRUE(contains(r.output, "RuntimeError: rank 1 failing on purpose")) << r.output;
  }
  if (pythons == 0) GTEST_SKIP() << "no Python with torch here (python3-torch, or make torch2)";
}

// torchrun's console and log filters: --local-ranks-filter shows only some
// local ranks on the console (their files keep everything), and
// --duplicate-stdout-filters copies matching lines of every rank to the
// attempt's filtered_stdout.log.
TEST(Launcher, ConsoleAndDuplicateFiltersAsTorchrunHasThem) {
  TempDir dir;
  Launcher launcher({"--nproc-per-node", "3", "--run-id", "f", "--log-dir", dir.path(), "--local-ranks-filter", "0,2",
                     "--duplicate-stdout-filters", "loss,,acc", "--duplicate-stderr-filters", "warn", "--", "/bin/sh",
                     "-c", "echo step $RANK; echo loss,acc $RANK; echo warn $RANK >&2"});
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "[0] step 0") && contains(r.output, "[2] step 2")) << r.output;
  EXPECT_FALSE(contains(r.output, "[1] ")) << r.output;
  EXPECT_EQ(read_text(dir.path() + "/f/attempt_0/1/stdout.log"), "step 1\nloss,acc 1\n");
  const std::string out = read_text(dir.path() + "/f/attempt_0/filtered_stdout.log");
  const std::string err = read_text(dir.path() + "/f/attempt_0/filtered_stderr.log");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(out, fmt::format("[{0}] loss,acc {0}\n", rank))) << out;
    EXPECT_TRUE(contains(err, fmt::format("[{0}] warn {0}\n", rank))) << err;
  }
  EXPECT_FALSE(contains(out, "step")) << out;
}

// --signals-to-handle: a signal named there stops the ranks (forwarded to
// them), as SIGTERM does by default; the options torchrun has that do not
// carry over are refused with their reason.
TEST(Launcher, SignalsToHandleAndRefusedTorchrunOptions) {
  TempDir dir;
  Launcher launcher({"--nproc-per-node", "2", "--signals-to-handle", "SIGTERM,SIGUSR1", "--", RANK_PROGRAM, "sleep"},
                    {{"PID_DIR", dir.path()}});
  const auto pids = rank_pids(dir.path(), 2);
  launcher.signal(SIGUSR1);
  const auto r = launcher.wait(30s);
  EXPECT_EQ(r.exit_code, 128 + SIGUSR1) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "received SIGUSR1, stopping all ranks")) << r.output;
  expect_all_gone(pids);
  for (const auto& [option, reason] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--virtual-local-rank"}, "lockstep's ranks place themselves by it"},
           {{"--numa-binding", "node"}, "does not read the GPUs' NUMA placement"},
           {{"--logs-specs", "x"}, "Python plug-in"},
           {{"--signals-to-handle", "SIGKILL"}, "cannot be handled"}}) {
    std::vector<std::string> args = option;
    args.insert(args.end(), {"--", "true"});
    const auto refused = Launcher(args).wait(20s);
    EXPECT_EQ(refused.exit_code, 2) << testing::describe(refused);
    EXPECT_TRUE(contains(refused.output, reason)) << refused.output;
  }
}

}  // namespace
}  // namespace lockstep
