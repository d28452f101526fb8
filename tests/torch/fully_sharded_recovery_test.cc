// Fully sharded training that survives a rank's death in place, as a user
// runs it: examples/fully_sharded --resilient (ShardBackup and
// ShardedResilientTrainer) under `lockstep run --on-rank-failure
// continue`, a rank killed (SIGKILL) at each phase of a step (between its
// forward and backward, before its shard's computation, before the
// backup's exchange is waited for, at the commit point, past it, after
// it), over shm and tcp at 3 ranks and hier at 4. Every run must end with
// every shard's parameters equal to the clean run's, byte for byte (the
// dead rank's from its successor's copy), and the launcher must exit 0.
// After a loss the survivors re-form the backup ring, so deaths one after
// another are taken over in place too. What one copy per shard cannot
// cover (two neighbours at once, a death while the ring is re-formed, a
// death while the checkpoint is written) is named, and the launcher's
// restart resumes from the sharded checkpoint's step that every rank
// holds: the clean run's bytes again. Replacements the launcher starts
// (--max-replacements) are fed their shards from the survivors' memory
// and the group trains whole again: killed, replaced and killed again, a
// replacement killed while fed, a survivor lost while one is fed, each
// ends with the clean run's bytes. Each run reports its step times by the
// ranks it ran on.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::contains;
using testing::describe;
using testing::read_bytes;
using testing::TempDir;

constexpr int kSteps = 6;
constexpr int kKillStep = 2;
constexpr int kCheckpointEvery = 2;  // written after step 1 (2 committed), before the kills
// Long enough, at kReplacedStepMs a step, for three replacements to start
// one after another (each process takes about a second to load libtorch
// and the data here, several on a loaded machine).
constexpr int kReplacedSteps = 800;
constexpr int kReplacedStepMs = 12;
// The long runs halve the learning rate once 3 steps have committed: an
// event no replacement (the first dies in step 5) sees itself, so each
// trains with the clean run's rate only if its peers fed it their options.
constexpr int kLrHalvedAt = 3;

// Replacements: the launcher's --max-replacements and the replacements'
// own kills (--kill-replacement RANK:INCARNATION:STEPS:PHASE).
struct Replacing {
  int max = 0;
  std::vector<std::string> kills;
};

struct Training {
  testing::RankResult result;
  std::vector<std::string> shards;  // each shard's parameters at the end, by shard
};

// `checkpoint` (a path or ""): with it, the checkpoint every kCheckpointEvery
// steps and one restart allowed. With replacements, each step is
// followed by a pause of kReplacedStepMs (not in the bits).
Training train(const std::string& backend, int world, const std::vector<std::string>& kills, const std::string& dir,
               const std::string& checkpoint = "", const Replacing& replacing = {}, int steps = kSteps) {
  std::vector<std::string> args{"--nproc-per-node", std::to_string(world), "--on-rank-failure", "continue",
                                "--grace-period", "2"};
  if (!checkpoint.empty()) args.insert(args.end(), {"--max-restarts", "1"});
  if (replacing.max > 0) args.insert(args.end(), {"--max-replacements", std::to_string(replacing.max)});
  args.insert(args.end(), {"--", FULLY_SHARDED, "--resilient", "--steps", std::to_string(steps), "--blocks", "2",
                           "--width", "64", "--batch-size", "8", "--subset", "600", "--save-shards", dir});
  if (!checkpoint.empty())
    args.insert(args.end(), {"--checkpoint", checkpoint, "--checkpoint-every", std::to_string(kCheckpointEvery)});
  for (const auto& k : kills) args.insert(args.end(), {"--kill", k});
  if (replacing.max > 0) args.insert(args.end(), {"--step-ms", std::to_string(kReplacedStepMs)});
  if (steps == kReplacedSteps) args.insert(args.end(), {"--halve-lr-at", std::to_string(kLrHalvedAt)});
  for (const auto& k : replacing.kills) args.insert(args.end(), {"--kill-replacement", k});
  testing::Launcher launcher(LOCKSTEP_CLI, args, {{"LOCKSTEP_BACKEND", backend}, {"LOCKSTEP_TIMEOUT", "20"}});
  Training run;
  run.result = launcher.wait(180s);
  for (int shard = 0; shard < world; ++shard) run.shards.push_back(read_bytes(fmt::format("{}/shard{}.bin", dir, shard)));
  return run;
}

class FullyShardedKills : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FullyShardedKills, EveryShardEndsAsTheCleanRunsBitForBit) {
  const auto& [backend, world] = GetParam();
  TempDir clean_dir;
  const Training clean = train(backend, world, {}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  for (const std::string& shard : clean.shards) ASSERT_FALSE(shard.empty()) << "the clean run wrote no shard";
  const std::vector<std::string> phases = {"forward", "shard", "backup", "barrier", "commit", "committed"};
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const int victim = static_cast<int>(i) % world;  // rank 0 among them: the store lives in the launcher
    SCOPED_TRACE(fmt::format("rank {} killed at {}", victim, phases[i]));
    TempDir dir;
    const Training killed = train(backend, world, {fmt::format("{}:{}:{}", victim, kKillStep, phases[i])}, dir.path());
    EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
    for (int shard = 0; shard < world; ++shard)
      EXPECT_TRUE(killed.shards[static_cast<std::size_t>(shard)] == clean.shards[static_cast<std::size_t>(shard)])
          << "shard " << shard << " differs from the clean run's ("
          << killed.shards[static_cast<std::size_t>(shard)].size() << " bytes)";
    EXPECT_TRUE(contains(killed.result.output, fmt::format("went on without rank {}", victim))) << killed.result.output;
    EXPECT_TRUE(contains(killed.result.output, fmt::format("the last on {} of {} ranks", world - 1, world)))
        << killed.result.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, FullyShardedKills,
                         ::testing::Values(std::make_tuple(std::string("shm"), 3), std::make_tuple(std::string("tcp"), 3),
                                           std::make_tuple(std::string("hier"), 4)),
                         [](const auto& info) {
                           return fmt::format("{}_{}ranks", std::get<0>(info.param), std::get<1>(info.param));
                         });

// Deaths one after another: rank 1 in step 2 (rank 2 then holds shards 1
// and 2, and rank 0 keeps copies of both in the re-formed ring), rank 2 in
// step 3: rank 0 holds every shard from then on, and each ends as the
// clean run's.
TEST(FullyShardedDeaths, OneAfterAnotherAreTakenOverInPlace) {
  TempDir clean_dir, dir;
  const Training clean = train("shm", 3, {}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  const Training killed =
      train("shm", 3, {fmt::format("1:{}:forward", kKillStep), fmt::format("2:{}:forward", kKillStep + 1)}, dir.path());
  EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
  EXPECT_TRUE(contains(killed.result.output, "went on without rank 1")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "went on without rank 2")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "holding shards [0, 1, 2]")) << killed.result.output;
  // The second re-form names the dead by the re-formed group's rank and
  // by world rank: world rank 2 is rank 1 of the group {0, 2}.
  EXPECT_TRUE(contains(killed.result.output, "re-forming the group in place without rank(s) 1 (world rank(s) 2)"))
      << killed.result.output;
  // The step times by group: steps 0 and 1 on the whole group (the first
  // left out as warm-up), 2 and 3 saw the losses, 4 and 5 on rank 0 alone.
  EXPECT_TRUE(contains(killed.result.output, "step time on 3 of 3 ranks: median")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "step time on 1 of 3 ranks: median")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "ms over 2 steps")) << killed.result.output;
  EXPECT_FALSE(contains(killed.result.output, "step time on 2 of 3 ranks")) << killed.result.output;
  for (int shard = 0; shard < 3; ++shard)
    EXPECT_TRUE(killed.shards[static_cast<std::size_t>(shard)] == clean.shards[static_cast<std::size_t>(shard)])
        << "shard " << shard << " differs from the clean run's";
}

void expect_the_clean_shards(const Training& run, const Training& clean) {
  ASSERT_EQ(run.shards.size(), clean.shards.size());
  for (std::size_t shard = 0; shard < clean.shards.size(); ++shard)
    EXPECT_TRUE(run.shards[shard] == clean.shards[shard])
        << "shard " << shard << " differs from the clean run's (" << run.shards[shard].size() << " bytes)";
}

Training clean_run(const std::string& backend, const std::string& dir) {
  return train(backend, 4, {}, dir, "", {}, kReplacedSteps);
}

// Kill, replace, kill again, at 4 ranks: the victim dies in step 5; its
// first replacement 10 steps after it joined (at the commit point), its
// second 10 steps after (between forward and backward); the third trains
// to the end. Each is fed its shard from the survivor holding it, and the
// job ends whole, every shard the clean run's bytes. The victim differs by
// backend: rank 0 too (a replacement that is the group's first rank).
class FullyShardedReplacements : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FullyShardedReplacements, KilledReplacedAndKilledAgainEndAsTheCleanRunBitForBit) {
  const auto& [backend, victim] = GetParam();
  TempDir clean_dir, dir;
  const Training clean = clean_run(backend, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  const Replacing replacing{3, {fmt::format("{}:1:10:barrier", victim), fmt::format("{}:2:10:forward", victim)}};
  const Training killed =
      train(backend, 4, {fmt::format("{}:5:forward", victim)}, dir.path(), "", replacing, kReplacedSteps);
  EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
  for (int incarnation = 1; incarnation <= 3; ++incarnation)
    EXPECT_TRUE(contains(killed.result.output,
                         fmt::format("world rank {} (replacement {}): joined at step", victim, incarnation)))
        << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, fmt::format("world rank {} joined again", victim)))
      << killed.result.output;
  // The group's first rank (a replacement, where rank 0 is the victim)
  // reports the steps on the group grown back apart.
  EXPECT_TRUE(contains(killed.result.output, "step time on 4 of 4 ranks, grown back by replacements: median"))
      << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "the last on 4 of 4 ranks")) << killed.result.output;
  expect_the_clean_shards(killed, clean);
}

INSTANTIATE_TEST_SUITE_P(Backends, FullyShardedReplacements,
                         ::testing::Values(std::make_tuple(std::string("shm"), 1), std::make_tuple(std::string("tcp"), 2),
                                           std::make_tuple(std::string("hier"), 0)),
                         [](const auto& info) {
                           return fmt::format("{}_rank{}", std::get<0>(info.param), std::get<1>(info.param));
                         });

// The first replacement of rank 1 dies while the survivors feed it: they
// go on as they were (rank 2 holding shard 1), and the second replacement
// is fed and joins.
TEST(FullyShardedReplacement, KilledWhileFedLeavesTheSurvivorsAsTheyWereAndTheNextJoins) {
  TempDir clean_dir, dir;
  const Training clean = clean_run("shm", clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  const Training killed = train("shm", 4, {"1:5:forward"}, dir.path(), "", {2, {"1:1:0:feed"}}, kReplacedSteps);
  EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
  EXPECT_FALSE(contains(killed.result.output, "world rank 1 (replacement 1): joined")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "world rank 1 (replacement 2): joined at step")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "the last on 4 of 4 ranks")) << killed.result.output;
  expect_the_clean_shards(killed, clean);
}

// Rank 2, which holds rank 1's shard, dies while it feeds rank 1's
// replacement: the survivors take rank 2's shards over from their ring's
// copies (rank 3 holds shards 1, 2 and 3), the replacement that was being
// fed ends, and once replacements for both wait, both are fed and the job
// ends whole.
TEST(FullyShardedReplacement, AHolderLostWhileItFeedsOneIsTakenOverAndBothRanksJoin) {
  TempDir clean_dir, dir;
  const Training clean = clean_run("shm", clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  const Training killed = train("shm", 4, {"1:5:forward", "2:5:feed"}, dir.path(), "", {3, {}}, kReplacedSteps);
  EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
  EXPECT_TRUE(contains(killed.result.output, "killed at step")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "went on without rank 2")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "holding shards [1, 2, 3]")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "world rank 1 joined again")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "world rank 2 joined again")) << killed.result.output;
  EXPECT_TRUE(contains(killed.result.output, "the last on 4 of 4 ranks")) << killed.result.output;
  expect_the_clean_shards(killed, clean);
}

// One backup per shard: what it cannot cover is named and ends the round
// instead of going on with a shard that may have lost its only copy; the
// launcher's restart resumes every rank from the checkpoint written before
// the first loss and the job ends as the clean run, byte for byte. One
// clean run serves every case.
struct Uncovered {
  std::string name;
  std::vector<std::string> kills;
  std::vector<std::string> said;  // what the survivors and the launcher say
};

TEST(FullyShardedUncovered, IsNamedAndTheRestartFromTheCheckpointEndsAsTheCleanRun) {
  const std::vector<Uncovered> cases = {
      // Rank 2 dies once the survivors of rank 1's death agreed, before
      // rank 0 holds a copy of what rank 2 holds.
      {"a death while the ring is re-formed",
       {fmt::format("1:{}:forward", kKillStep), fmt::format("2:{}:re-formed", kKillStep)},
       {"a rank was lost while the survivors re-formed the backup ring after world rank 1 was lost",
        "restart from the last checkpoint"}},
      {"two neighbours at once",
       {fmt::format("1:{}:forward", kKillStep + 1), fmt::format("2:{}:forward", kKillStep + 1)},
       {"world ranks 1, 2 lost at once", "restart from the last checkpoint"}},
      // Ranks 0 and 2 write step 4's files, rank 1 none: the restart loads
      // step 2, which every rank still holds.
      {"one lost while the checkpoint is written",
       {fmt::format("1:{}:checkpoint", 2 * kCheckpointEvery - 1)},
       {"killed at step 3, checkpoint", "rank 1 died and the others could not go on in place"}},
  };
  TempDir clean_dir;
  const Training clean = train("shm", 3, {}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  for (const Uncovered& uncovered : cases) {
    SCOPED_TRACE(uncovered.name);
    TempDir dir;
    const Training killed = train("shm", 3, uncovered.kills, dir.path(), dir.path() + "/ckpt");
    EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
    for (const std::string& said : uncovered.said) EXPECT_TRUE(contains(killed.result.output, said)) << said;
    EXPECT_TRUE(contains(killed.result.output, "restarting all ranks (restart 1 of 1)")) << killed.result.output;
    EXPECT_TRUE(contains(killed.result.output, fmt::format("after {} steps", kCheckpointEvery)))
        << killed.result.output;
    for (int shard = 0; shard < 3; ++shard)
      EXPECT_TRUE(killed.shards[static_cast<std::size_t>(shard)] == clean.shards[static_cast<std::size_t>(shard)])
          << "shard " << shard << " differs from the clean run's";
  }
}

}  // namespace
}  // namespace lockstep
