// The forked-ranks harness itself: how a child ended is reported as it
// was, and a child whose status was taken by someone else (a stray
// waitpid(-1) elsewhere in the test process) is never read as a clean exit.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include "harness/process_ranks.h"

namespace lockstep::testing {
namespace {

using namespace std::chrono_literals;

EnvMap no_env(int) { return {}; }

TEST(ProcessRanks, ReportsACleanExitAsExitZero) {
  ProcessRanks ranks(2, no_env, [](int) {});
  for (const auto& r : ranks.wait_all(30s)) {
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_FALSE(r.status_lost) << describe(r);
  }
}

TEST(ProcessRanks, AChildReapedElsewhereIsNotACleanExit) {
  ProcessRanks ranks(1, no_env, [](int) {});
  int status = 0;
  ASSERT_EQ(::waitpid(ranks.pid(0), &status, 0), ranks.pid(0));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // it did exit cleanly, but the harness cannot know
  const auto results = ranks.wait_all(30s);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].status_lost);
  EXPECT_NE(results[0].exit_code, 0) << describe(results[0]);
  EXPECT_NE(describe(results[0]).find("exit status lost"), std::string::npos) << describe(results[0]);
}

}  // namespace
}  // namespace lockstep::testing
