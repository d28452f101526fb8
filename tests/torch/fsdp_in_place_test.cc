// A fully sharded job whose rank is killed mid-step goes on in place:
// three rank processes train with Adam, a ShardBackup and a
// ShardedResilientTrainer; one is SIGKILLed at a point of the second step
// (before its forward, between forward and backward, before the backup's
// gradient exchange ends, at the commit point, just past it, or once it
// committed). The survivors' step fails, the trainer abandons it, re-forms
// the group without the dead rank, and takes the step again as a held step
// (or commits it, where a rank had passed the commit point), the dead
// rank's shard held by its ring successor from its backup's copy, as is
// every step after. Every survivor's shard, and the successor's copy of
// the dead rank's, end equal, bit for bit, to a clean run of three ranks
// (thread ranks, stepped by hand). The survivors then re-form the backup
// ring, so a second death, and a third at four ranks, is taken over in the
// same way; two neighbours of the re-formed ring at once are named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <ostream>
#include <cstdlib>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "harness/launcher.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/resilient_fsdp.h"
#include "lockstep/torch/shard_backup.h"
#include "torch/fsdp_fixtures.h"
#include "torch/thread_ranks.h"

namespace lockstep::torch {
namespace {

using namespace fsdp_fixtures;
using testing::per_rank;
using testing::TorchThreadWorld;

constexpr int kRanks = 3;
constexpr int kDeathStep = 1;  // the victim dies in this step

// Where in step kDeathStep the victim dies.
enum class Death { before_forward, after_forward, before_backup, at_commit_point, past_commit_point, after_commit };
constexpr int kCollectiveTimeoutS = 20;

std::string death_name(Death d) {
  switch (d) {
    case Death::before_forward: return "before_forward";
    case Death::after_forward: return "after_forward";
    case Death::before_backup: return "before_backup_exchange";
    case Death::at_commit_point: return "at_commit_point";
    case Death::past_commit_point: return "past_commit_point";
    case Death::after_commit: return "after_commit";
  }
  return "?";
}

// For gtest's names of failing cases.
void PrintTo(Death d, std::ostream* os) { *os << death_name(d); }

// The trainer's phase the death comes at (after_forward: in the loss).
std::string_view phase_of(Death d) {
  switch (d) {
    case Death::before_forward: return "shard";
    case Death::before_backup: return "backup";
    case Death::at_commit_point: return "barrier";
    case Death::past_commit_point: return "commit";
    case Death::after_commit: return "committed";
    case Death::after_forward: break;
  }
  return "";
}

// Thread ranks, no death, stepped by hand: each rank's shards after the
// last step.
std::vector<std::vector<Tensor>> clean_run(const std::string& backend, const std::vector<Batch>& data,
                                           int ranks = kRanks) {
  std::vector<std::vector<Tensor>> out(static_cast<std::size_t>(ranks));
  auto plains = per_rank(ranks, [](int) { return plain_mlp(); });
  TorchThreadWorld world(ranks, backend);
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto optimizer = make_optimizer("adam", model->parameters());
    ShardBackup backup(*model, *optimizer);
    for (int s = 0; s < kSteps; ++s) {
      optimizer->zero_grad();
      backward_on_shards(*model, data, s, {rank}, ranks);
      optimizer->step();
      backup.step();
    }
    out[static_cast<std::size_t>(rank)] = unit_shards(*model);
  });
  return out;
}

struct Kill {
  int rank = -1;
  Death death = Death::before_forward;
  int step = kDeathStep;
};

// One rank's training under the trainer; a victim kills itself where its
// Kill says. Saves to <dir>/rank<r>.pt the shards it holds at the end
// (first their indices, then each one's blocks: its own from its units,
// the others from its copies).
void train_rank(int rank, const std::vector<Kill>& kills, const std::vector<Batch>& data, const std::string& dir) {
  at::set_num_threads(1);
  auto pg = init_process_group();
  auto model = sharded_mlp(plain_mlp(), pg, {});
  auto optimizer = make_optimizer("adam", model->parameters());
  ShardBackup backup(*model, *optimizer);
  const auto dies_at = [&](Death death, std::uint64_t step) {
    for (const Kill& k : kills)
      if (k.rank == rank && k.death == death && static_cast<int>(step) == k.step) ::raise(SIGKILL);
  };
  ShardedResilientOptions options;
  options.observer = [&](std::string_view phase, std::uint64_t step) {
    for (const Kill& k : kills)
      if (phase == phase_of(k.death)) dies_at(k.death, phase == "committed" ? step - 1 : step);
  };
  ShardedResilientTrainer trainer(model, *optimizer, backup, options);
  while (trainer.steps_committed() < static_cast<std::uint64_t>(kSteps)) {
    const StepOutcome outcome = trainer.step([&](const Shard& shard) {
      const Batch& batch = data[static_cast<std::size_t>(shard.step)];
      auto loss = ::torch::mse_loss(model->forward(shard_of(batch.x, shard.index, shard.count)),
                                    shard_of(batch.y, shard.index, shard.count));
      dies_at(Death::after_forward, shard.step);
      return loss;
    });
    for (int lost : outcome.lost)
      std::printf("rank %d: step %d went on without rank %d (taken again %d times); holding shards %s\n", rank,
                  static_cast<int>(outcome.step), lost, outcome.redone, fmt::format("{}", trainer.shards()).c_str());
  }
  const std::vector<int> shards = trainer.shards();
  std::vector<Tensor> saved{::torch::tensor(std::vector<std::int64_t>(shards.begin(), shards.end()))};
  for (int shard : shards)
    for (const Tensor& block : trainer.shard_blocks(shard)) saved.push_back(block.clone());
  ::torch::save(saved, fmt::format("{}/rank{}.pt", dir, rank));
}

std::vector<testing::RankResult> run_ranks(const std::string& backend, const std::vector<Kill>& kills,
                                           const std::vector<Batch>& data, const std::string& dir,
                                           int world = kRanks) {
  const testing::ReservedPort port;
  testing::ProcessRanks ranks(
      world, [&](int rank) { return testing::rank_env(rank, world, port.number(), backend, kCollectiveTimeoutS); },
      [&](int rank) { train_rank(rank, kills, data, dir); });
  return ranks.wait_all(std::chrono::seconds(3 * kCollectiveTimeoutS));
}

// A survivor's saved shards against the clean run's: it holds `shards`,
// and each one's blocks equal the clean run's owner's, bit for bit.
void expect_clean_shards(const std::string& dir, int rank, const std::vector<int>& shards,
                         const std::vector<std::vector<Tensor>>& want) {
  std::vector<Tensor> got;
  ::torch::load(got, fmt::format("{}/rank{}.pt", dir, rank));
  ASSERT_FALSE(got.empty()) << "rank " << rank;
  const auto held = got.front();
  EXPECT_TRUE(::torch::equal(held, ::torch::tensor(std::vector<std::int64_t>(shards.begin(), shards.end()))))
      << "rank " << rank << " holds shards " << held;
  std::vector<std::pair<int, Tensor>> expected;  // (shard, block)
  for (int shard : shards)
    for (const Tensor& block : want[static_cast<std::size_t>(shard)]) expected.emplace_back(shard, block);
  ASSERT_EQ(got.size(), 1 + expected.size()) << "rank " << rank;
  for (std::size_t k = 0; k < expected.size(); ++k) {
    const auto& [shard, block] = expected[k];
    EXPECT_TRUE(::torch::equal(got[k + 1], block))
        << "rank " << rank << "'s " << (shard == rank ? "own shard" : fmt::format("copy of shard {}", shard))
        << ", block " << k << ", differs by " << (got[k + 1] - block).abs().max().item<float>();
  }
}

class KilledMidStep : public ::testing::TestWithParam<std::tuple<std::string, int, Death>> {};

TEST_P(KilledMidStep, TheSurvivorsTakeTheStepAgainHoldingItsShardAndEndAsACleanRun) {
  const auto [backend, victim, death] = GetParam();
  const auto data = batches(kWidths.front(), 43);
  const testing::TempDir dir;
  for (const auto& r : run_ranks(backend, {Kill{victim, death}}, data, dir.path())) {
    if (r.rank == victim) {
      EXPECT_EQ(r.signal, SIGKILL) << testing::describe(r);
      continue;
    }
    EXPECT_EQ(r.exit_code, testing::kExitOk) << testing::describe(r);
    // Before the commit point the step is taken again without the victim.
    // Past it the step commits on every survivor: one that passed the
    // commit point too takes the next step again without the victim; one
    // whose commit point failed (the victim's last message to it lost with
    // the victim) commits in recovery, one behind, nothing taken again.
    const bool committed = death == Death::past_commit_point || death == Death::after_commit;
    const auto went_on = [&](int step, int redone) {
      return r.output.find(fmt::format("step {} went on without rank {} (taken again {} times)", step, victim,
                                       redone)) != std::string::npos;
    };
    if (committed)
      EXPECT_TRUE(went_on(kDeathStep + 1, 1) || went_on(kDeathStep, 0)) << testing::describe(r);
    else
      EXPECT_TRUE(went_on(kDeathStep, 1)) << testing::describe(r);
  }
  if (HasFailure()) return;
  const auto want = clean_run(backend, data);
  const int successor = (victim + 1) % kRanks;
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == victim) continue;
    std::vector<int> shards{rank};
    if (rank == successor) shards = {std::min(rank, victim), std::max(rank, victim)};
    expect_clean_shards(dir.path(), rank, shards, want);
  }
}

// Rank 0 hosts the store that the re-formed group meets through: the
// victims are the others (the successor of rank 2 is rank 0, which then
// holds shards 0 and 2).
INSTANTIATE_TEST_SUITE_P(BackendsAndVictims, KilledMidStep,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(1, 2),
                                            ::testing::Values(Death::before_forward, Death::after_forward,
                                                              Death::before_backup, Death::at_commit_point,
                                                              Death::past_commit_point, Death::after_commit)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_rank" + std::to_string(std::get<1>(info.param)) +
                                  "_killed_" + death_name(std::get<2>(info.param));
                         });

// After a death the survivors re-form the backup ring: each keeps copies
// of every shard its predecessor in the re-formed group holds. A second
// death, at any point of a held step, is then taken over as the first was.
// Six ranks, so that the survivors stay a majority without a launcher to
// say who ended (ProcessGroup::shrink), and the global batch divides among
// them: rank 1 dies in step 1 (rank 2 then holds shards 1 and 2, rank 3
// keeps copies of both), rank 2 in step 2: rank 3 holds shards 1, 2 and 3,
// and every survivor ends as the clean run.
class SecondDeath : public ::testing::TestWithParam<std::tuple<std::string, Death>> {};

TEST_P(SecondDeath, IsTakenOverFromTheReformedRing) {
  constexpr int kWorld = 6;
  const auto [backend, death] = GetParam();
  const auto data = batches(kWidths.front(), 43);
  const testing::TempDir dir;
  const std::vector<Kill> kills{{1, Death::before_forward, kDeathStep}, {2, death, kDeathStep + 1}};
  for (const auto& r : run_ranks(backend, kills, data, dir.path(), kWorld)) {
    if (r.rank == 1 || r.rank == 2) {
      EXPECT_EQ(r.signal, SIGKILL) << testing::describe(r);
      continue;
    }
    EXPECT_EQ(r.exit_code, testing::kExitOk) << testing::describe(r);
    EXPECT_NE(r.output.find("went on without rank 2"), std::string::npos) << testing::describe(r);
  }
  if (HasFailure()) return;
  const auto want = clean_run(backend, data, kWorld);
  expect_clean_shards(dir.path(), 0, {0}, want);
  expect_clean_shards(dir.path(), 3, {1, 2, 3}, want);
  expect_clean_shards(dir.path(), 4, {4}, want);
  expect_clean_shards(dir.path(), 5, {5}, want);
}

INSTANTIATE_TEST_SUITE_P(BackendsAndDeaths, SecondDeath,
                         ::testing::Combine(::testing::Values("shm", "tcp"),
                                            ::testing::Values(Death::before_forward, Death::after_forward,
                                                              Death::before_backup, Death::at_commit_point,
                                                              Death::past_commit_point, Death::after_commit)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_rank2_killed_" + death_name(std::get<1>(info.param));
                         });

// Six ranks, three deaths one after another: each re-formed ring covers
// the next, and the shards move on. Rank 1 dies in step 1 (rank 2 holds 1
// and 2), rank 3 in step 2 (rank 4 holds 3 and 4), rank 2 in step 3: rank
// 4, its successor in the ring 0, 2, 4, 5, takes shards 1 and 2 from the
// copies it kept of them, the ring's exchanges carrying two shards a rank.
TEST(ThreeDeaths, MoveTheShardsOnAndEndAsTheCleanRun) {
  constexpr int kWorld = 6;
  const auto data = batches(kWidths.front(), 43);
  const testing::TempDir dir;
  const std::vector<Kill> kills{
      {1, Death::before_forward, 1}, {3, Death::before_backup, 2}, {2, Death::after_forward, 3}};
  for (const auto& r : run_ranks("tcp", kills, data, dir.path(), kWorld)) {
    if (r.rank >= 1 && r.rank <= 3) {
      EXPECT_EQ(r.signal, SIGKILL) << testing::describe(r);
      continue;
    }
    EXPECT_EQ(r.exit_code, testing::kExitOk) << testing::describe(r);
  }
  if (HasFailure()) return;
  const auto want = clean_run("tcp", data, kWorld);
  expect_clean_shards(dir.path(), 0, {0}, want);
  expect_clean_shards(dir.path(), 4, {1, 2, 3, 4}, want);
  expect_clean_shards(dir.path(), 5, {5}, want);
}

// Two neighbours in the re-formed ring at once take a shard and its only
// copy: named, and the job stops (it restarts from its checkpoint), never a
// wrong shard. Six ranks: rank 1 dies in step 1 (ring 0, 2, 3, 4, 5), then
// ranks 2 and 3 at once in step 2.
TEST(NeighboursInTheReformedRing, AreNamedAndNotSurvived) {
  constexpr int kWorld = 6;
  const auto data = batches(kWidths.front(), 43);
  const testing::TempDir dir;
  const std::vector<Kill> kills{
      {1, Death::before_forward, 1}, {2, Death::before_forward, 2}, {3, Death::before_forward, 2}};
  for (const auto& r : run_ranks("shm", kills, data, dir.path(), kWorld)) {
    if (r.rank >= 1 && r.rank <= 3) {
      EXPECT_EQ(r.signal, SIGKILL) << testing::describe(r);
      continue;
    }
    EXPECT_NE(r.exit_code, testing::kExitOk) << testing::describe(r);
    EXPECT_NE(r.output.find("world ranks 2, 3 lost at once after world rank 1 was lost"), std::string::npos)
        << testing::describe(r);
    EXPECT_NE(r.output.find("restart from the last checkpoint"), std::string::npos) << testing::describe(r);
  }
}

// A held step would update each rank's buffers once per shard it holds.
TEST(ShardedResilientTrainerRefuses, ModelsWithBuffers) {
  auto nets = per_rank(2, [](int) { return ::torch::nn::Sequential(::torch::nn::Linear(4, 4), ::torch::nn::BatchNorm1d(4)); });
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = fully_shard(nets[static_cast<std::size_t>(rank)].ptr(), borrow(pg));
    ::torch::optim::SGD optimizer(model->parameters(), 0.1);
    ShardBackup backup(*model, optimizer);
    try {
      ShardedResilientTrainer trainer(model, optimizer, backup);
      ADD_FAILURE() << "a model with BatchNorm's buffers was taken";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("LayerNorm instead of BatchNorm"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace lockstep::torch
