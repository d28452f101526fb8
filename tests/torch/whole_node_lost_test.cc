// Every rank of one node dies while its launcher lives (docs/faults.md,
// "A whole node"): two launchers on this machine form a job of two nodes
// of two ranks each (examples/in_place_recovery over tcp, under
// --on-rank-failure continue), and both ranks of one node kill themselves
// at the same step. The other node's ranks must go on alone and end with
// the clean run's parameters byte for byte, and both launchers must exit
// 0: the node whose ranks died waits for the job's outcome instead of
// reporting its round failed (which stopped the survivors too). Either
// node: node 0 also hosts the launchers' store, which must outlive its
// ranks. When the ranks of every node die, no node has one left: the job
// restarts from its checkpoint (--max-restarts) with the clean run's
// result.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/launcher.h"
#include "harness/reserved_port.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::contains;
using testing::count_of;
using testing::describe;
using testing::read_bytes;
using testing::TempDir;

constexpr int kSteps = 40;
constexpr int kKillStep = 10;

struct Job {
  testing::RankResult node0, node1;
  std::string params;  // the group's first rank's at the end
};

// Both nodes of one job; `more` goes to the launchers; each of `killed_ranks`
// kills itself at step kKillStep, before its reduction.
Job train(const std::string& dir, const std::vector<int>& killed_ranks, std::vector<std::string> more = {}) {
  const testing::ReservedPort port;
  const auto node = [&](int rank) {
    std::vector<std::string> args{"--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr", "127.0.0.1",
                                  "--master-port", port.text(), "--nproc-per-node", "2", "--on-rank-failure",
                                  "continue", "--grace-period", "2"};
    args.insert(args.end(), more.begin(), more.end());
    args.insert(args.end(), {"--", IN_PLACE_RECOVERY, "--steps", std::to_string(kSteps), "--batch", "64",
                             "--subset", "1200", "--save-params", dir + "/params.bin", "--checkpoint",
                             dir + "/job.ckpt", "--checkpoint-every", "4"});
    for (int r : killed_ranks) args.insert(args.end(), {"--kill", fmt::format("{}:{}:reduce", r, kKillStep)});
    return args;
  };
  const testing::EnvMap env{{"LOCKSTEP_BACKEND", "tcp"}, {"LOCKSTEP_TIMEOUT", "20"}};
  testing::Launcher first(LOCKSTEP_CLI, node(0), env);
  testing::Launcher second(LOCKSTEP_CLI, node(1), env);
  Job job;
  job.node0 = first.wait(180s);
  job.node1 = second.wait(180s);
  job.params = read_bytes(dir + "/params.bin");
  return job;
}

class WholeNodeLost : public ::testing::TestWithParam<int> {};

TEST_P(WholeNodeLost, TheOtherNodeFinishesAloneAndBothLaunchersExitZero) {
  const int emptied = GetParam();
  TempDir clean_dir;
  const Job clean = train(clean_dir.path(), {});
  ASSERT_EQ(clean.node0.exit_code, 0) << describe(clean.node0);
  ASSERT_EQ(clean.node1.exit_code, 0) << describe(clean.node1);
  ASSERT_FALSE(clean.params.empty()) << "the clean run wrote no parameters";

  TempDir dir;
  const Job run = train(dir.path(), {2 * emptied, 2 * emptied + 1});
  const testing::RankResult& lost = emptied == 0 ? run.node0 : run.node1;
  const testing::RankResult& going_on = emptied == 0 ? run.node1 : run.node0;
  EXPECT_EQ(lost.exit_code, 0) << describe(lost);
  EXPECT_EQ(going_on.exit_code, 0) << describe(going_on);
  EXPECT_TRUE(contains(lost.output, "every rank of this node has died")) << lost.output;
  EXPECT_TRUE(contains(lost.output, "the other nodes finished the job without this node's ranks")) << lost.output;
  EXPECT_EQ(count_of(going_on.output, fmt::format("{} steps in", kSteps)), 2u) << going_on.output;
  EXPECT_EQ(count_of(going_on.output, "2 ranks at the end"), 2u) << going_on.output;
  EXPECT_FALSE(contains(run.node0.output + run.node1.output, "restarting all ranks")) << run.node0.output;
  EXPECT_TRUE(run.params == clean.params) << "the parameters differ from the clean run's";
}

// Node 0 hosts the launchers' store; node 1 does not.
INSTANTIATE_TEST_SUITE_P(Nodes, WholeNodeLost, ::testing::Values(0, 1),
                         [](const auto& info) { return fmt::format("node{}", info.param); });

TEST(EveryNodeLost, NoRankIsLeftAndTheJobRestartsFromItsCheckpoint) {
  TempDir clean_dir;
  const Job clean = train(clean_dir.path(), {});
  ASSERT_FALSE(clean.params.empty()) << "the clean run wrote no parameters";
  TempDir dir;
  const Job run = train(dir.path(), {0, 1, 2, 3}, {"--max-restarts", "1"});
  EXPECT_EQ(run.node0.exit_code, 0) << describe(run.node0);
  EXPECT_EQ(run.node1.exit_code, 0) << describe(run.node1);
  const std::string both = run.node0.output + run.node1.output;
  EXPECT_TRUE(contains(both, "no node has a rank left")) << both;
  EXPECT_EQ(count_of(both, "restarting all ranks (restart 1 of 1)"), 2u) << both;
  EXPECT_EQ(count_of(both, "4 ranks at the end"), 4u) << both;
  EXPECT_TRUE(run.params == clean.params) << "the parameters differ from the clean run's";
}

}  // namespace
}  // namespace lockstep
