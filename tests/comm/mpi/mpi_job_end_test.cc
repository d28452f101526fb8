// A failed job under mpirun ends: one rank stops issuing collectives, the
// others time out and report it, and the whole mpirun job exits non-zero
// within about the timeout, leaving no rank running (MPI_Abort, not
// MPI_Finalize, after a group failed; docs/errors.md "Under mpirun").
// Runs mpirun itself (not under it), so it can time the job and look for
// leftover ranks. Not thread-safe (gtest's main thread).
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;

constexpr int kRanks = 3;
constexpr int kTimeoutSeconds = 2;
// mpirun's own job limit (its --timeout): far beyond what a passing run
// takes, and below the wait here, so that mpirun reaps its ranks itself
// even when the job does not end.
constexpr int kMpirunLimitSeconds = 45;
constexpr Duration kWaitForMpirun = 60s;
// A job the failure ends is over by then; one it does not end runs on to
// mpirun's 45 s limit. Not tighter: mpirun's teardown after MPI_Abort took
// 17 s on a loaded 2-core machine (the failure itself comes at ~2 s).
constexpr int kJobEndsWithinSeconds = 30;

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

class MpiJobEnd : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // Only what mpirun provides: another launcher's variables would make
    // the ranks look for a store that is not there.
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                             "LOCKSTEP_MPI_ABORT_ON_FAILURE"})
      ::unsetenv(name);
  }
};

// diag_program "stuck": rank 1 sleeps for a minute before its first
// allreduce; ranks 0 and 2 time out after 2 s, the watchdog names rank 1.
TEST_P(MpiJobEnd, AFailedGroupEndsTheWholeJob) {
  TempDir dir;
  std::vector<std::string> args{"-n", std::to_string(kRanks)};
  for (auto& flag : split_words(MPIRUN_FLAGS)) args.push_back(flag);
  args.insert(args.end(), {"--timeout", std::to_string(kMpirunLimitSeconds), DIAG_PROGRAM, "stuck"});
  testing::EnvMap env{{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                      {"PMIX_MCA_gds", "hash"}, {"PID_DIR", dir.path()}, {"LOCKSTEP_FLIGHT_DIR", dir.path()},
                      {"LOCKSTEP_BACKEND", GetParam()}, {"LOCKSTEP_TIMEOUT", std::to_string(kTimeoutSeconds)},
                      {"LOCKSTEP_CONNECT_TIMEOUT", "30"}};
  const auto start = Clock::now();
  const testing::RankResult result = testing::run_program(MPIRUN, args, env, kWaitForMpirun);
  const double seconds = seconds_between(start, Clock::now());

  EXPECT_FALSE(result.hit_deadline) << testing::describe(result);
  EXPECT_NE(result.exit_code, 0) << testing::describe(result);
  EXPECT_LT(seconds, kJobEndsWithinSeconds) << "the job went on after the failure:\n" << result.output;
  EXPECT_TRUE(testing::contains(result.output, "rank(s) 1 never reached #0")) << "the report is missing:\n" << result.output;
  // The line before MPI_Abort carries the whole failure, the verdict naming
  // the cause included (it used to stop at the first line).
  const auto abort_line = result.output.find("ending the mpirun job with MPI_Abort");
  ASSERT_NE(abort_line, std::string::npos) << result.output;
  EXPECT_NE(result.output.find("rank(s) 1 never reached #0", abort_line), std::string::npos) << result.output;
  testing::expect_gone(testing::pids_in(dir.path(), kRanks));
}

INSTANTIATE_TEST_SUITE_P(Backends, MpiJobEnd, ::testing::Values("mpi", "shm"));

}  // namespace
}  // namespace lockstep
