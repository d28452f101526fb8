// A fully sharded job whose rank is killed mid-step goes on in place, by
// hand (the trainer that will drive this is not written yet): three rank
// processes train with Adam and a ShardBackup; one is SIGKILLed before its
// forward or between its forward and its backward. The survivors' forward
// or backward fails, the units
// abandon the step (abandon_step), the group re-forms without the dead rank
// (shrink), and the step is taken again as a held step, the dead rank's
// shard held by its ring successor from its backup's copy (kept_blocks,
// step_kept), as is every step after. Every survivor's shard, and the
// successor's copy of the dead rank's, end equal, bit for bit, to a clean
// run of three ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "comm/shard_map.h"
#include "harness/launcher.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/shard_backup.h"
#include "torch/fsdp_fixtures.h"
#include "torch/fsdp_unit.h"
#include "torch/thread_ranks.h"

namespace lockstep::torch {
namespace {

using namespace fsdp_fixtures;
using testing::per_rank;
using testing::TorchThreadWorld;

constexpr int kRanks = 3;
constexpr int kDeathStep = 1;  // the victim dies in this step

// Where in the step the victim dies: the survivors' forward fails (an
// all-gather), or their backward (a reduce-scatter or an all-gather).
enum class Death { before_forward, after_forward };
constexpr int kCollectiveTimeoutS = 20;

// Three thread ranks, no death: each rank's shards after the last step.
std::vector<std::vector<Tensor>> clean_run(const std::string& backend, const std::vector<Batch>& data) {
  std::vector<std::vector<Tensor>> out(kRanks);
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  TorchThreadWorld world(kRanks, backend);
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    auto optimizer = make_optimizer("adam", model->parameters());
    ShardBackup backup(*model, *optimizer);
    for (int s = 0; s < kSteps; ++s) {
      optimizer->zero_grad();
      backward_on_shards(*model, data, s, {rank}, kRanks);
      optimizer->step();
      backup.step();
    }
    out[static_cast<std::size_t>(rank)] = unit_shards(*model);
  });
  return out;
}

// Who holds which shard once the group re-formed without one rank: the
// dead rank's with its successor in the ring (its backup's keeper).
struct TakeOver {
  int dead = -1;
  int successor = -1;
  std::vector<int> holder;  // by shard: a rank of the re-formed group
};

TakeOver take_over(const ProcessGroup& reformed) {
  const std::vector<int>& members = reformed.members_of_parent();
  TakeOver t;
  for (int r = 0; r < kRanks && t.dead < 0; ++r)
    if (std::find(members.begin(), members.end(), r) == members.end()) t.dead = r;
  t.successor = (t.dead + 1) % kRanks;
  for (int shard = 0; shard < kRanks; ++shard) {
    const int old = shard == t.dead ? t.successor : shard;
    t.holder.push_back(static_cast<int>(std::find(members.begin(), members.end(), old) - members.begin()));
  }
  return t;
}

// One rank's training: ordinary steps until the group fails, held steps
// from the failed one on. Saves its shards (and, on the successor, the
// copy of the dead rank's) to <dir>/rank<r>.pt.
void train_rank(int rank, int victim, Death death, const std::vector<Batch>& data, const std::string& dir) {
  at::set_num_threads(1);
  auto pg = init_process_group();
  auto model = sharded_mlp(plain_mlp(), pg, {});
  auto optimizer = make_optimizer("adam", model->parameters());
  ShardBackup backup(*model, *optimizer);
  auto& root = model->unit();
  std::shared_ptr<ProcessGroup> group;
  TakeOver held;
  for (int s = 0; s < kSteps; ++s) {
    optimizer->zero_grad();
    if (!group) {
      const bool dies = rank == victim && s == kDeathStep;
      try {
        if (dies && death == Death::before_forward) ::raise(SIGKILL);
        auto loss = ::torch::mse_loss(model->forward(shard_of(data[static_cast<std::size_t>(s)].x, rank, kRanks)),
                                      shard_of(data[static_cast<std::size_t>(s)].y, rank, kRanks));
        if (dies) ::raise(SIGKILL);
        loss.backward();
        optimizer->step();
        backup.step();
        continue;
      } catch (const Error& e) {
        std::printf("rank %d: step %d failed: %s\n", rank, s, e.what());
        root.abandon_step();
        const auto* peer = dynamic_cast<const PeerError*>(&e);
        const bool named = peer && peer->peer() >= 0 && peer->peer() != pg->rank();
        group = pg->shrink(named ? std::vector<int>{peer->peer()} : std::vector<int>{}, std::chrono::seconds(5));
        held = take_over(*group);
        std::printf("rank %d: re-formed as rank %d of %d without rank %d\n", rank, group->rank(), group->size(),
                    held.dead);
        optimizer->zero_grad();
      }
    }
    std::vector<std::vector<Tensor>> blocks(root.step().units.size());
    if (rank == held.successor) {
      const auto kept = backup.kept_blocks();
      for (std::size_t k = 0; k < kept.size(); ++k) blocks[k].push_back(kept[k]);
    }
    root.begin_held_step(group, held.holder, rank, blocks);
    backward_on_shards(*model, data, s, shards_held(held.holder, group->rank()), kRanks);
    const auto reduced = root.finish_held_step();
    optimizer->step();
    if (rank != held.successor) continue;
    std::vector<Tensor> gradients;
    for (const auto& r : reduced) gradients.push_back(r.empty() ? Tensor() : r.front());
    backup.step_kept(gradients);
  }
  std::vector<Tensor> saved = unit_shards(*model);
  if (rank == held.successor)
    for (const Tensor& block : backup.kept_blocks()) saved.push_back(block.clone());
  ::torch::save(saved, fmt::format("{}/rank{}.pt", dir, rank));
}

class KilledMidStep : public ::testing::TestWithParam<std::tuple<std::string, int, Death>> {};

TEST_P(KilledMidStep, TheSurvivorsTakeTheStepAgainHoldingItsShardAndEndAsACleanRun) {
  const auto [backend, victim, death] = GetParam();
  const auto data = batches(kWidths.front(), 43);
  const testing::TempDir dir;
  {
    const testing::ReservedPort port;
    testing::ProcessRanks ranks(
        kRanks,
        [&](int rank) {
          return testing::EnvMap{{"RANK", std::to_string(rank)},
                                 {"WORLD_SIZE", std::to_string(kRanks)},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", std::to_string(port.number())},
                                 {"LOCKSTEP_BACKEND", backend},
                                 {"LOCKSTEP_TIMEOUT", std::to_string(kCollectiveTimeoutS)},
                                 {"LOCKSTEP_CONNECT_TIMEOUT", "60"}};
        },
        [&](int rank) { train_rank(rank, victim, death, data, dir.path()); });
    for (const auto& r : ranks.wait_all(std::chrono::seconds(3 * kCollectiveTimeoutS))) {
      if (r.rank == victim) {
        EXPECT_EQ(r.signal, SIGKILL) << testing::describe(r);
        continue;
      }
      EXPECT_EQ(r.exit_code, testing::kExitOk) << testing::describe(r);
      EXPECT_NE(r.output.find("re-formed as rank"), std::string::npos) << testing::describe(r);
    }
  }
  if (HasFailure()) return;
  const auto want = clean_run(backend, data);
  const int successor = (victim + 1) % kRanks;
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == victim) continue;
    std::vector<Tensor> got;
    ::torch::load(got, fmt::format("{}/rank{}.pt", dir.path(), rank));
    const auto& mine = want[static_cast<std::size_t>(rank)];
    const auto& lost = want[static_cast<std::size_t>(victim)];
    ASSERT_EQ(got.size(), mine.size() + (rank == successor ? lost.size() : 0)) << "rank " << rank;
    for (std::size_t k = 0; k < got.size(); ++k) {
      const Tensor& expected = k < mine.size() ? mine[k] : lost[k - mine.size()];
      EXPECT_TRUE(::torch::equal(got[k], expected))
          << "rank " << rank << (k < mine.size() ? "'s shard" : "'s copy of the dead rank's shard") << " of unit "
          << k % mine.size() << " differs by " << (got[k] - expected).abs().max().item<float>();
    }
  }
}

// Rank 0 hosts the store that the re-formed group meets through: the
// victims are the others (the successor of rank 2 is rank 0, which then
// holds shards 0 and 2).
INSTANTIATE_TEST_SUITE_P(BackendsAndVictims, KilledMidStep,
                         ::testing::Combine(::testing::Values("shm", "tcp"), ::testing::Values(1, 2),
                                            ::testing::Values(Death::before_forward, Death::after_forward)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_rank" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) == Death::before_forward ? "_killed_before_forward"
                                                                                    : "_killed_after_forward");
                         });

}  // namespace
}  // namespace lockstep::torch
