// Replacements (docs/faults.md, "Replacements join the running group"):
// examples/in_place_recovery under `lockstep run --on-rank-failure continue
// --max-replacements N` at 4 ranks over shm, tcp and hier. A rank is
// killed, its replacement joins at a step boundary, is fed by its peers
// and is killed in turn, three times over (rank 1, and rank 0, whose
// replacement becomes the group's first rank); a replacement dies while it
// is fed; a replacement joins while another rank dies during its feeding.
// Every run must end at its full size with the parameters of the clean
// run, byte for byte, on every rank, replacements included (the trainer
// itself compares every rank's state by digest once a replacement is fed,
// and stops the job if one differs), and the launcher must exit 0; the
// same with the optimizer's state sharded (ZeRO-1, each partition backed
// up on the next rank), against the unsharded clean run. A replacement
// already started when a long step must be redone joins before the redo,
// with the launchers' rendezvous in a static store or in etcd. A survivor
// whose replica drifted is named when a replacement is fed.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/etcd_process.h"
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

constexpr int kWorld = 4;
// Long enough, at --step-ms 15, for three replacements to start (a
// process that loads libtorch and the data set) and join before the end.
constexpr int kSteps = 600;

struct Case {
  std::string name;
  std::vector<std::string> kills;              // --kill RANK:STEP:PHASE
  std::vector<std::string> replacement_kills;  // --kill-replacement RANK:INCARNATION:STEPS:PHASE
  int replacements = 0;                        // --max-replacements
  int joins = 0;                               // replacements that must join
  bool zero = false;                           // --zero: the optimizer's state sharded, with backups
};

struct Training {
  testing::RankResult result;
  std::string params;                  // the group's first rank's
  std::vector<std::string> each_rank;  // every world rank's, at the end
};

Training train(const std::string& backend, const Case& c, const std::string& dir) {
  std::vector<std::string> args{"--nproc-per-node", std::to_string(kWorld), "--on-rank-failure", "continue",
                                "--max-replacements", std::to_string(c.replacements), "--grace-period", "2", "--",
                                IN_PLACE_RECOVERY, "--steps", std::to_string(kSteps), "--batch", "64", "--subset",
                                "1200", "--save-params", dir + "/params.bin", "--save-params-of-each-rank",
                                dir + "/each"};
  if (c.replacements > 0) args.insert(args.end(), {"--step-ms", "15"});
  for (const auto& k : c.kills) args.insert(args.end(), {"--kill", k});
  for (const auto& k : c.replacement_kills) args.insert(args.end(), {"--kill-replacement", k});
  if (c.zero) args.push_back("--zero");
  testing::Launcher launcher(LOCKSTEP_CLI, args, {{"LOCKSTEP_BACKEND", backend}, {"LOCKSTEP_TIMEOUT", "20"}});
  Training run;
  run.result = launcher.wait(240s);
  run.params = read_bytes(dir + "/params.bin");
  for (int r = 0; r < kWorld; ++r) run.each_rank.push_back(read_bytes(fmt::format("{}/each.{}", dir, r)));
  return run;
}

std::vector<Case> cases() {
  return {
      {"kill_replace_kill_again", {"1:10:reduce"}, {"1:1:20:barrier", "1:2:20:forward"}, 3, 3},
      {"first_rank_replaced", {"0:10:commit"}, {"0:1:20:committed", "0:2:20:backward"}, 3, 3},
      {"replacement_dies_while_fed", {"1:10:reduce"}, {"1:1:0:feed"}, 2, 1},
      // Rank 2 dies at the first feeding at or after step 12: the one of
      // rank 1's replacement.
      {"joins_while_another_dies", {"1:10:reduce", "2:12:feed"}, {}, 2, 2},
      // ZeRO-1: the replacement takes its partition back from the backup
      // that stepped it meanwhile (each partition a quarter of the elements).
      {"sharded_kill_replace_kill_again", {"1:10:reduce"}, {"1:1:20:barrier", "1:2:20:forward"}, 3, 3, true},
      {"sharded_first_rank_replaced", {"0:10:commit"}, {"0:1:20:committed", "0:2:20:backward"}, 3, 3, true},
  };
}

class Replacements : public ::testing::TestWithParam<std::string> {};

TEST_P(Replacements, TheGroupGrowsBackAndEndsWithTheCleanRunsParametersOnEveryRank) {
  const std::string backend = GetParam();
  TempDir clean_dir;
  const Training clean = train(backend, Case{.name = "clean"}, clean_dir.path());
  ASSERT_EQ(clean.result.exit_code, 0) << describe(clean.result);
  ASSERT_FALSE(clean.params.empty()) << "the clean run wrote no parameters";
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    const Training run = train(backend, c, dir.path());
    EXPECT_EQ(run.result.exit_code, 0) << describe(run.result);
    EXPECT_TRUE(run.params == clean.params) << c.name << ": the parameters differ from the clean run's";
    for (int r = 0; r < kWorld; ++r)
      EXPECT_TRUE(run.each_rank[static_cast<std::size_t>(r)] == clean.params)
          << c.name << ": world rank " << r << " ended with other parameters than the clean run's";
    EXPECT_EQ(count_of(run.result.output, "fed by its peers"), static_cast<std::size_t>(c.joins)) << run.result.output;
    EXPECT_EQ(count_of(run.result.output, fmt::format("{} ranks at the end", kWorld)), static_cast<std::size_t>(kWorld))
        << run.result.output;
    EXPECT_TRUE(contains(run.result.output, "started a replacement for rank")) << run.result.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Replacements, ::testing::Values("shm", "tcp", "hier"),
                         [](const auto& info) { return std::string(info.param); });

// After a death, a replacement already started is worth waiting for when
// the step without it would take longer than its start: here each shard's
// computation takes 4 s (--shard-ms), so a survivor holding two shards
// would redo the step in 8 s, and the first rank waits up to 4 s for the
// replacement to ask (a process start, even on a loaded machine; the
// window of 20 s lets it wait that long). The replacement joins before
// the step is redone (at step 1, the step the death interrupted, not at
// the commit point after it), computes its own shard in the redo, and the
// job ends with the clean run's parameters on every rank (the clean run's
// of the same trainer: ZeRO-1's or not).
//
// The launcher's arguments after its rendezvous's: one replacement at most,
// 4 s a shard, the program's `more` flags, every rank's parameters saved.
std::vector<std::string> long_steps(const std::string& dir, const std::vector<std::string>& more) {
  std::vector<std::string> args{"--nproc-per-node", std::to_string(kWorld), "--on-rank-failure", "continue",
                                "--max-replacements", "1", "--grace-period", "2", "--", IN_PLACE_RECOVERY,
                                "--steps", "3", "--batch", "64", "--subset", "1200", "--shard-ms", "4000",
                                "--window", "20", "--save-params", dir + "/params.bin", "--save-params-of-each-rank",
                                dir + "/each"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class LongSteps : public ::testing::TestWithParam<bool> {};

TEST_P(LongSteps, AReplacementAlreadyStartedJoinsBeforeTheStepIsRedone) {
  const bool zero = GetParam();
  const auto train = [zero](const std::string& dir, const std::vector<std::string>& kill) {
    std::vector<std::string> args = long_steps(dir, kill);
    if (zero) args.push_back("--zero");
    testing::Launcher launcher(LOCKSTEP_CLI, args, {{"LOCKSTEP_TIMEOUT", "30"}});
    return launcher.wait(120s);
  };
  TempDir clean_dir;
  const testing::RankResult clean = train(clean_dir.path(), {});
  ASSERT_EQ(clean.exit_code, 0) << describe(clean);
  const std::string clean_params = read_bytes(clean_dir.path() + "/params.bin");
  ASSERT_FALSE(clean_params.empty()) << "the clean run wrote no parameters";
  TempDir dir;
  const testing::RankResult run = train(dir.path(), {"--kill", "1:1:reduce"});
  EXPECT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_TRUE(contains(run.output, "(replacement 1): joined at step 1, fed by its peers")) << run.output;
  EXPECT_TRUE(contains(run.output, "step 1: world rank(s) 1 joined as replacements; 4 ranks")) << run.output;
  for (int r = 0; r < kWorld; ++r)
    EXPECT_TRUE(read_bytes(fmt::format("{}/each.{}", dir.path(), r)) == clean_params)
        << "world rank " << r << " ended with other parameters than the clean run's";
}

// Plain, and ZeRO-1 with its backups: the replacement takes its partition
// back before the redo, from the backup that kept it.
INSTANTIATE_TEST_SUITE_P(Trainers, LongSteps, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "zero" : "plain"); });

// The same with the launchers meeting in etcd: the ranks read the round's
// store, where the launcher copies each replacement's start, not etcd; so
// the replacement is seen on its way and joins before the redo there too.
TEST(LongStepsUnderEtcd, AReplacementAlreadyStartedJoinsBeforeTheStepIsRedone) {
  if (!std::filesystem::exists(testing::kEtcd))
    GTEST_SKIP() << "etcd-server is not installed (apt-get install etcd-server)";
  TempDir dir;
  testing::ReservedPort client, peer;
  const std::string client_url = "http://127.0.0.1:" + client.text();
  const std::string peer_url = "http://127.0.0.1:" + peer.text();
  testing::EtcdProcess etcd({"--data-dir", dir.path() + "/etcd", "--listen-client-urls", client_url,
                             "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
                             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", "default=" + peer_url,
                             "--log-level", "warn"},
                            dir.path() + "/etcd.log");
  etcd.wait_listening(client.number(), 30s);
  std::vector<std::string> args{"--nnodes", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                                "127.0.0.1:" + client.text(), "--rdzv-id", "long-steps"};
  const std::vector<std::string> job = long_steps(dir.path(), {"--kill", "1:1:reduce"});
  args.insert(args.end(), job.begin(), job.end());
  testing::Launcher launcher(LOCKSTEP_CLI, args, {{"LOCKSTEP_TIMEOUT", "30"}});
  const testing::RankResult run = launcher.wait(120s);
  EXPECT_EQ(run.exit_code, 0) << describe(run);
  EXPECT_TRUE(contains(run.output, "(replacement 1): joined at step 1, fed by its peers")) << run.output;
  const std::string first = read_bytes(dir.path() + "/each.0");
  ASSERT_FALSE(first.empty()) << "rank 0 wrote no parameters";
  for (int r = 1; r < kWorld; ++r)
    EXPECT_TRUE(read_bytes(fmt::format("{}/each.{}", dir.path(), r)) == first)
        << "world rank " << r << " ended with other parameters than rank 0's";
}

// A replacement that starts as the job ends finds it finished: it exits 0
// without joining, and the job is still a success.
TEST(Replacement, OneThatComesTooLateFindsTheJobFinished) {
  TempDir dir;
  testing::Launcher launcher(LOCKSTEP_CLI,
                             {"--nproc-per-node", "3", "--on-rank-failure", "continue", "--max-replacements", "1",
                              "--grace-period", "2", "--", IN_PLACE_RECOVERY, "--steps", "40", "--batch", "48",
                              "--subset", "1200", "--kill", "2:38:reduce"},
                             {{"LOCKSTEP_TIMEOUT", "20"}});
  const auto r = launcher.wait(120s);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.output, "the job finished before this replacement")) << r.output;
}

// The feed's comparison covers every member, not the replacement alone:
// a survivor whose parameters drifted (world rank 3 nudges one as the
// replacement is admitted, before it is fed from world rank 0) is named,
// and the job stops rather than train on replicas that differ. The
// members digest what they hold while the replacement builds its model:
// a digest taken from anything but the drifted rank's own bytes would let
// it through.
TEST(Replacement, ASurvivorThatDriftedIsNamedWhenTheReplacementIsFed) {
  testing::Launcher launcher(LOCKSTEP_CLI,
                             {"--nproc-per-node", "4", "--on-rank-failure", "continue", "--max-replacements", "1",
                              "--grace-period", "2", "--", IN_PLACE_RECOVERY, "--steps", std::to_string(kSteps),
                              "--batch", "64", "--subset", "1200", "--step-ms", "15", "--kill", "1:10:reduce",
                              "--drift", "3"},
                             {{"LOCKSTEP_TIMEOUT", "20"}});
  const auto r = launcher.wait(180s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.output, "world rank(s) 3 hold other bytes")) << r.output;
  EXPECT_FALSE(contains(r.output, "steps in")) << "a rank finished its training: " << r.output;
}

// --max-replacements replaces a rank while the others go on; without
// --on-rank-failure continue nothing goes on, and the launcher says so.
TEST(Replacement, NeedsTheContinueMode) {
  testing::Launcher launcher(LOCKSTEP_CLI, {"--nproc-per-node", "2", "--max-replacements", "1", "--", "/bin/true"}, {});
  const auto r = launcher.wait(30s);
  EXPECT_NE(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.output, "add --on-rank-failure continue")) << r.output;
}

}  // namespace
}  // namespace lockstep
