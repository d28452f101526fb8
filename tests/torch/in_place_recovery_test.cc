// The kill matrix (docs/faults.md): examples/in_place_recovery under
// `lockstep run --on-rank-failure continue`, a rank killed (SIGKILL) at
// each phase of a step (before forward, in backward, before the reduction,
// before the buffers' broadcast, before the commit point, past it, after
// the commit, while the first rank writes a checkpoint), two ranks at
// once, and a second while the group re-forms,
// over shm and tcp at 3 and 4 ranks and hier at 4. Every run must end with the
// parameters of the clean run of the same world, byte for byte, every
// survivor must have committed every step, and the launcher must exit 0.
// The victims vary (rank 0 among them): the store lives in the launcher.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::contains;
using testing::describe;
using testing::TempDir;

constexpr int kSteps = 8;
constexpr int kKillStep = 3;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Training {
  testing::RankResult result;
  std::string params;
};

Training train(const std::string& backend, int world, const std::vector<std::string>& kills, const std::string& dir) {
  const std::string params = dir + "/params.bin";
  const std::string checkpoint = dir + "/job.ckpt";
  std::vector<std::string> args{"--nproc-per-node", std::to_string(world), "--on-rank-failure", "continue",
                                "--grace-period", "2", "--", IN_PLACE_RECOVERY, "--steps", std::to_string(kSteps),
                                "--batch", std::to_string(16 * world), "--subset", "1200", "--save-params", params,
                                "--checkpoint", checkpoint, "--checkpoint-every", "2"};
  for (const auto& k : kills) args.insert(args.end(), {"--kill", k});
  testing::Launcher launcher(LOCKSTEP_CLI, args, {{"LOCKSTEP_BACKEND", backend}, {"LOCKSTEP_TIMEOUT", "20"}});
  Training run;
  run.result = launcher.wait(180s);
  run.params = read_bytes(params);
  return run;
}

struct Case {
  std::string name;
  std::vector<std::string> kills;  // "rank:step:phase"
  int survivors;
};

std::vector<Case> cases(int world) {
  std::vector<Case> out;
  const std::vector<std::string> phases = {"forward", "backward", "reduce", "buffers", "barrier", "commit", "committed"};
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const int victim = static_cast<int>(i) % world;  // rank 0 among them
    out.push_back({phases[i], {fmt::format("{}:{}:{}", victim, kKillStep, phases[i])}, world - 1});
  }
  // The checkpoint after step kKillStep is written by the first rank.
  out.push_back({"checkpoint", {fmt::format("0:{}:checkpoint", kKillStep)}, world - 1});
  if (world >= 4) {
    out.push_back({"two_at_once", {fmt::format("1:{}:reduce", kKillStep), fmt::format("2:{}:reduce", kKillStep)},
                   world - 2});
    out.push_back({"second_while_reforming",
                   {fmt::format("3:{}:forward", kKillStep), fmt::format("1:{}:re-form", kKillStep)}, world - 2});
  }
  return out;
}

class KillMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(KillMatrix, SurvivorsEndWithTheCleanRunsParametersBitForBit) {
  const auto& [backend, world] = GetParam();
  TempDir clean_dir;
  const Training clean = train(backend, world, {}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  ASSERT_FALSE(clean.params.empty()) << "the clean run wrote no parameters";
  for (const Case& c : cases(world)) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const Training killed = train(backend, world, c.kills, dir.path());
    EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
    EXPECT_TRUE(killed.params == clean.params)
        << c.name << ": the parameters differ from the clean run's (" << killed.params.size() << " and "
        << clean.params.size() << " bytes)";
    EXPECT_TRUE(contains(killed.result.output, "the other ranks go on without it")) << killed.result.output;
    // Every survivor committed every step, in a group of the survivors.
    const std::string done = fmt::format("{} steps in", kSteps);
    std::size_t survivors = 0;
    for (std::size_t at = 0; (at = killed.result.output.find(done, at)) != std::string::npos; at += done.size())
      ++survivors;
    EXPECT_EQ(survivors, static_cast<std::size_t>(c.survivors)) << killed.result.output;
    EXPECT_TRUE(contains(killed.result.output, fmt::format("{} ranks at the end", c.survivors))) << killed.result.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, KillMatrix,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(3, 4)),
                         [](const auto& info) {
                           return fmt::format("{}_{}ranks", std::get<0>(info.param), std::get<1>(info.param));
                         });

// hier with its ranks on one host: its intra-host shm group and its (here
// empty) host ring re-form together.
INSTANTIATE_TEST_SUITE_P(Hier, KillMatrix, ::testing::Values(std::make_tuple(std::string("hier"), 4)),
                         [](const auto& info) { return fmt::format("hier_{}ranks", std::get<1>(info.param)); });

// Without --on-rank-failure continue, the launcher stops the job as before.
TEST(InPlaceRecovery, TheDefaultStillStopsTheJob) {
  TempDir dir;
  testing::Launcher launcher(LOCKSTEP_CLI,
                             {"--nproc-per-node", "3", "--grace-period", "2", "--", IN_PLACE_RECOVERY, "--steps", "8",
                              "--batch", "48", "--subset", "1200", "--kill", "1:3:forward"},
                             {{"LOCKSTEP_TIMEOUT", "20"}});
  const auto r = launcher.wait(120s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 failed first")) << r.output;
}

}  // namespace
}  // namespace lockstep
