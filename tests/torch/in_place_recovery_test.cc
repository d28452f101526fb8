// The kill matrix (docs/faults.md): examples/in_place_recovery under
// `lockstep run --on-rank-failure continue`, a rank killed (SIGKILL) at
// each phase of a step, over bucket layouts of 1 to 4 buckets (before
// forward, in backward, before the reduction, inside each later bucket's,
// before the buffers' broadcast, before the commit point, past it, after
// the commit, while the first rank writes a checkpoint), two ranks at
// once, a second while the group re-forms, and a rank frozen (SIGSTOP)
// before the reduction, which its peers drop once their collective times
// out and the launcher then kills, over shm and tcp at 3 and 4 ranks and
// hier at 4. Every run must end with the
// parameters of the clean run of the same world, byte for byte, every
// survivor must have committed every step, and the launcher must exit 0.
// The victims vary (rank 0 among them): the store lives in the launcher.
// With the optimizer state sharded (ZeRO-1 with a backup), deaths at each
// phase end the same way, and where an owner and its backup die together
// the job restarts from its checkpoint with the clean run's result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::contains;
using testing::describe;
using testing::read_bytes;
using testing::TempDir;

constexpr int kSteps = 8;
constexpr int kKillStep = 3;

struct Training {
  testing::RankResult result;
  std::string params;
};

struct Case {
  std::string name;
  std::vector<std::string> kills;    // "rank:step:phase"
  std::vector<std::string> freezes;  // the same, SIGSTOP
  int survivors = 0;
  std::string bucket_cap_mb = "25";  // the reduction's buckets (25: one)
  std::string shards_per_rank = "1";
  std::vector<std::string> extra;    // more of the example's flags (--zero, --no-backup)
  std::string max_restarts;          // --max-restarts, where the job may fall back to its checkpoint
};

Training train(const std::string& backend, int world, const Case& c, const std::string& dir) {
  const std::string params = dir + "/params.bin";
  const std::string checkpoint = dir + "/job.ckpt";
  std::vector<std::string> args{"--nproc-per-node", std::to_string(world), "--on-rank-failure", "continue",
                                "--grace-period", "2", "--", IN_PLACE_RECOVERY, "--steps", std::to_string(kSteps),
                                "--batch", std::to_string(16 * world), "--subset", "1200", "--save-params", params,
                                "--checkpoint", checkpoint, "--checkpoint-every", "2", "--bucket-cap-mb",
                                c.bucket_cap_mb, "--shards-per-rank", c.shards_per_rank};
  for (const auto& k : c.kills) args.insert(args.end(), {"--kill", k});
  for (const auto& k : c.freezes) args.insert(args.end(), {"--freeze", k});
  args.insert(args.end(), c.extra.begin(), c.extra.end());
  if (!c.max_restarts.empty()) args.insert(args.begin(), {"--max-restarts", c.max_restarts});
  // A frozen rank is noticed when a collective times out: a short timeout
  // and window there, a long one elsewhere (a loaded machine).
  const bool frozen = !c.freezes.empty();
  if (frozen) args.insert(args.end(), {"--window", "3"});
  testing::Launcher launcher(LOCKSTEP_CLI, args,
                             {{"LOCKSTEP_BACKEND", backend}, {"LOCKSTEP_TIMEOUT", frozen ? "3" : "20"}});
  Training run;
  run.result = launcher.wait(180s);
  run.params = read_bytes(params);
  return run;
}

std::vector<Case> cases(int world) {
  std::vector<Case> out;
  const std::vector<std::string> phases = {"forward", "backward", "reduce", "buffers", "barrier", "commit", "committed"};
  // The bucket layouts (the example's MLP has 4 parameters): 1, 2, 3 and 4
  // buckets; the clean run has one, and the bits must not depend on it.
  const std::vector<std::string> caps = {"25", "0.004", "0.0001", "0.00001"};
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const int victim = static_cast<int>(i) % world;  // rank 0 among them
    out.push_back({phases[i], {fmt::format("{}:{}:{}", victim, kKillStep, phases[i])}, {}, world - 1,
                   caps[i % caps.size()]});
  }
  // Inside each later bucket's reduction, the earlier ones in flight.
  for (int bucket = 1; bucket <= 3; ++bucket)
    out.push_back({fmt::format("bucket{}", bucket), {fmt::format("{}:{}:bucket{}", bucket % world, kKillStep, bucket)},
                   {}, world - 1, "0.00001"});
  // The checkpoint after step kKillStep is written by the first rank.
  out.push_back({"checkpoint", {fmt::format("0:{}:checkpoint", kKillStep)}, {}, world - 1});
  out.push_back({"frozen", {}, {fmt::format("{}:{}:reduce", world - 1, kKillStep)}, world - 1});
  if (world >= 4) {
    out.push_back({"two_at_once", {fmt::format("1:{}:reduce", kKillStep), fmt::format("2:{}:reduce", kKillStep)},
                   {}, world - 2});
    out.push_back({"second_while_reforming",
                   {fmt::format("3:{}:forward", kKillStep), fmt::format("1:{}:re-form", kKillStep)}, {}, world - 2});
  }
  return out;
}

class KillMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(KillMatrix, SurvivorsEndWithTheCleanRunsParametersBitForBit) {
  const auto& [backend, world] = GetParam();
  TempDir clean_dir;
  const Training clean = train(backend, world, Case{}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  ASSERT_FALSE(clean.params.empty()) << "the clean run wrote no parameters";
  for (const Case& c : cases(world)) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const Training killed = train(backend, world, c, dir.path());
    EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
    EXPECT_TRUE(killed.params == clean.params)
        << c.name << ": the parameters differ from the clean run's (" << killed.params.size() << " and "
        << clean.params.size() << " bytes)";
    EXPECT_TRUE(contains(killed.result.output, "the other ranks go on without it")) << killed.result.output;
    if (!c.freezes.empty())
      EXPECT_TRUE(contains(killed.result.output, "stopped answering its peers, who re-formed their group without it"))
          << killed.result.output;
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

// Two logical shards per rank: after a loss the survivors share out two
// shards each, and the result is still the clean run's (of two per rank).
TEST(InPlaceRecovery, TwoShardsPerRankSurviveTwoDeaths) {
  Case clean{.name = "clean", .shards_per_rank = "2"};
  Case killed{.name = "killed",
              .kills = {fmt::format("1:{}:reduce", kKillStep), fmt::format("2:{}:forward", kKillStep + 2)},
              .survivors = 2,
              .shards_per_rank = "2"};
  TempDir clean_dir, dir;
  const Training a = train("shm", 4, clean, clean_dir.path());
  ASSERT_EQ(a.result.exit_code, 0) << describe(a.result);
  const Training b = train("shm", 4, killed, dir.path());
  EXPECT_EQ(b.result.exit_code, 0) << describe(b.result);
  EXPECT_TRUE(!a.params.empty() && a.params == b.params) << "the parameters differ from the clean run's";
  // Each of the two survivors ends with four of the eight shards.
  EXPECT_TRUE(contains(b.result.output, "this rank now holds shards 0,1,4,5 of 8") &&
              contains(b.result.output, "this rank now holds shards 2,3,6,7 of 8"))
      << b.result.output;
}

// What the ranks report of the optimizer state they keep ("optimizer
// state N bytes of M"): the sum over the ranks, the most one rank keeps,
// and M (the unsharded optimizer's).
struct StateBytes {
  std::size_t sum = 0, most = 0, whole = 0;
};
StateBytes state_bytes_kept(const std::string& output) {
  const std::string marker = "optimizer state ";
  StateBytes bytes;
  for (std::size_t at = 0; (at = output.find(marker, at)) != std::string::npos; at += marker.size()) {
    std::size_t kept = 0;
    if (std::sscanf(output.c_str() + at, "optimizer state %zu bytes of %zu", &kept, &bytes.whole) != 2) continue;
    bytes.sum += kept;
    bytes.most = std::max(bytes.most, kept);
  }
  return bytes;
}

// ZeRO-1 in the trainer (--zero): each partition of the optimizer's state
// on its owner and the next rank, exactly two copies in all, and no rank
// more than two partitions' worth (the partitions are equal ranges of
// elements, where the example's first weight alone is 96% of them). A
// rank killed
// at each phase (the first rank, owner of the largest partition, among
// them), and a second while the group re-forms: the survivors end with the
// parameters of the unsharded clean run, bit for bit, over shm and tcp.
TEST(InPlaceRecovery, ShardedOptimizerStateSurvivesADeathAtEachPhase) {
  TempDir clean_dir;
  const Training clean = train("shm", 4, Case{}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  TempDir sharded_dir;
  const Training sharded = train("shm", 4, Case{.name = "sharded", .extra = {"--zero"}}, sharded_dir.path());
  ASSERT_EQ(sharded.result.exit_code, 0) << describe(sharded.result);
  EXPECT_TRUE(!clean.params.empty() && sharded.params == clean.params) << "ZeRO-1 ended with other parameters";
  const StateBytes bytes = state_bytes_kept(sharded.result.output);
  EXPECT_TRUE(bytes.whole > 0 && bytes.sum == 2 * bytes.whole)
      << "every partition must be kept twice: " << bytes.sum << " bytes kept of " << bytes.whole << "\n"
      << sharded.result.output;
  // Two partitions of a quarter each, rounded up to a whole element (SGD's
  // momentum: 4-byte floats).
  EXPECT_LE(bytes.most, 2 * (bytes.whole / 4 + sizeof(float)))
      << "a rank keeps more than its partition and its backup's\n" << sharded.result.output;
  const std::vector<std::pair<std::string, Case>> kills = {
      {"shm", {"forward", {fmt::format("3:{}:forward", kKillStep)}, {}, 3}},
      {"shm", {"reduce", {fmt::format("1:{}:reduce", kKillStep)}, {}, 3}},
      {"shm", {"commit", {fmt::format("0:{}:commit", kKillStep)}, {}, 3}},
      {"shm", {"committed", {fmt::format("2:{}:committed", kKillStep)}, {}, 3}},
      {"shm", {"second_while_reforming", {fmt::format("3:{}:forward", kKillStep), fmt::format("1:{}:re-form", kKillStep)},
               {}, 2}},
      {"tcp", {"commit", {fmt::format("0:{}:commit", kKillStep)}, {}, 3}},
      {"tcp", {"barrier", {fmt::format("2:{}:barrier", kKillStep)}, {}, 3}},
  };
  for (auto [backend, c] : kills) {
    SCOPED_TRACE(backend + " " + c.name);
    c.extra = {"--zero"};
    TempDir dir;
    const Training killed = train(backend, 4, c, dir.path());
    EXPECT_EQ(killed.result.exit_code, 0) << describe(killed.result);
    EXPECT_TRUE(killed.params == clean.params) << c.name << ": the parameters differ from the clean run's";
    EXPECT_TRUE(contains(killed.result.output, fmt::format("{} ranks at the end", c.survivors)))
        << killed.result.output;
  }
}

// Where every keeper of a partition dies (two neighbours in the ring at
// once, or one rank with the backup off), the survivors name the lost
// partition and the job falls back to its checkpoint, whose optimizer
// state was consolidated: the restarted job ends with the clean run's
// parameters.
TEST(InPlaceRecovery, ShardedStateLostWithAllItsKeepersRestartsFromTheCheckpoint) {
  TempDir clean_dir;
  const Training clean = train("shm", 4, Case{}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  const std::vector<Case> cases = {
      {.name = "two_neighbours",
       .kills = {fmt::format("0:{}:reduce", kKillStep), fmt::format("1:{}:reduce", kKillStep)},
       .extra = {"--zero"},
       .max_restarts = "1"},
      {.name = "no_backup", .kills = {fmt::format("2:{}:commit", kKillStep)}, .extra = {"--zero", "--no-backup"},
       .max_restarts = "1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const Training run = train("shm", 4, c, dir.path());
    EXPECT_EQ(run.result.exit_code, 0) << describe(run.result);
    EXPECT_TRUE(run.params == clean.params) << c.name << ": the parameters differ from the clean run's";
    EXPECT_TRUE(contains(run.result.output, "the state is gone, so the job restarts from its last checkpoint"))
        << run.result.output;
    EXPECT_TRUE(contains(run.result.output, "restarting all ranks (restart 1 of 1)")) << run.result.output;
    if (c.name == "two_neighbours")
      EXPECT_TRUE(contains(run.result.output, "partition 0 (parameters 0[0:") &&
                  contains(run.result.output, "was kept by world ranks 0 and 1 only, and all are lost"))
          << run.result.output;
    else
      EXPECT_TRUE(contains(run.result.output, "was kept by world rank 2 alone (the backup is off"))
          << run.result.output;
  }
}

// A program that does not re-form its group (here lockstep's DDP, as a
// ZeRO-1 or fully_shard job would) under --on-rank-failure continue: the
// launcher says the survivors could not go on in place and falls back to
// the restart from the checkpoint.
TEST(InPlaceRecovery, AProgramThatCannotGoOnInPlaceFallsBackToTheRestart) {
  TempDir dir;
  testing::Launcher launcher(LOCKSTEP_CLI,
                             {"--nproc-per-node", "3", "--on-rank-failure", "continue", "--max-restarts", "1",
                              "--grace-period", "2", "--", IN_PLACE_RECOVERY, "--plain", "--steps", "8", "--batch",
                              "48", "--subset", "1200", "--checkpoint", dir.path() + "/job.ckpt", "--checkpoint-every",
                              "2", "--kill", "1:3:forward"},
                             {{"LOCKSTEP_TIMEOUT", "20"}});
  const auto r = launcher.wait(180s);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.output, "rank 1 died and the others could not go on in place")) << r.output;
  EXPECT_TRUE(contains(r.output, "falling back to the restart of every rank")) << r.output;
  EXPECT_TRUE(contains(r.output, "restarting all ranks (restart 1 of 1)")) << r.output;
}

}  // namespace
}  // namespace lockstep
