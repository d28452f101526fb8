// Fully sharded training steps that survive a rank's death in place
// (docs/fsdp.md, "Backup shards"; docs/faults.md): the fully_shard side of
// ResilientTrainer. Each rank keeps its ring predecessor's shard with a
// ShardBackup; when a rank dies, the survivors re-form the group
// (ProcessGroup::shrink), the dead rank's successor holds its shard from
// the copy, and every step from then on is a held step (the units'
// begin_held_step: each unit gathered once, forward and backward once per
// held shard, one reduction in shard order), so the shards and the copy
// end bit for bit as a run of the whole group without the failure.
//
//   auto model = lockstep::torch::fully_shard(net, pg);
//   torch::optim::Adam optimizer(model->parameters(), 1e-3);
//   lockstep::torch::ShardBackup backup(*model, optimizer);
//   lockstep::torch::ShardedResilientTrainer trainer(model, optimizer, backup);
//   while (trainer.steps_committed() < steps)
//     trainer.step([&](const lockstep::torch::Shard& shard) {
//       auto [x, y] = batch_of(shard.index, shard.count, shard.step);  // depends on the shard, not the rank
//       return torch::nll_loss(model->forward(x), y);
//     });
//
// A step: the user's function and backward for each held shard, the
// backup's gradient exchange ended (ShardBackup::receive_gradients), then
// the commit point (a barrier), then the optimizer's step and the copy's,
// both local. A death before the commit point: the units abandon the step
// (FsdpUnit::abandon_step), the backup its exchange, and the step is taken
// again held, from shards and a copy still at its start. A death after a
// rank passed it: every rank had reached it, so every survivor holds its
// reduced gradients and its copy's, and commits (the survivors agree on
// the highest step any committed, as ResilientTrainer's do).
//
// After a loss the survivors re-form the backup ring: each keeps copies of
// every shard its predecessor in the re-formed group holds, kept current
// by the held steps (their reduced gradients exchanged before the commit
// point), so a later death is taken over as the first was, by its
// successor there; several ranks apart in the ring may die at once.
//
// What it does not cover, each named when it happens (Error; the job
// restarts from its last checkpoint, lockstep run --max-restarts): two
// neighbours of the ring lost at once (a shard and its only copy), a rank
// lost while the survivors re-form the ring, and a rank left out of the
// re-formed group.
//
// Replacements (lockstep run --max-replacements): the launcher starts a
// new process for a dead rank, the same program, whose init_process_group
// joins the running group; its fully_shard and ShardBackup build the units
// alone and its trainer is fed by its peers. Once a replacement waits for
// every lost rank (the units' layout is the whole job's: the group grows
// back only to it), the survivors grow the group after a committed step,
// each returning shard's parameters and optimizer state go from the
// survivor holding it to its replacement (compared by digest on both
// ends), the ring of copies is re-formed over the whole job, and the
// steps go on there, every shard on its own rank again. A replacement
// lost while it is fed leaves the survivors as they were; a survivor lost
// meanwhile is taken over as in a step. Models
// with buffers (BatchNorm's running statistics: each rank's own under
// fully_shard) are refused (ConfigError), since a held step would update
// them once per held shard.
//
// The function must compute the shard's loss from the shard's data alone
// and must not call collectives; libtorch's default generator is seeded
// from (seed, step, shard) before each call, as ResilientTrainer does.
// Not thread-safe: one training thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/resilient.h"
#include "lockstep/torch/shard_backup.h"

namespace lockstep::torch {

struct ShardedResilientOptions {
  std::uint64_t seed = 0;        // libtorch's generator is seeded from (seed, step, shard) before each shard
  std::uint64_t first_step = 0;  // steps already committed (a resumed job)
  // How long survivors wait for a rank that neither answers nor is known
  // to have ended before they go on without it (ProcessGroup::shrink).
  Duration window = std::chrono::seconds(10);
  // Called at each phase of a step, for logs and for tests that kill a
  // rank at an exact point: "shard" (before the user's function, per
  // shard), "backup" (before the backup's gradient exchange is waited
  // for), "barrier" (before the commit point), "commit" (past it),
  // "committed", "re-form" (before the group re-forms after a loss),
  // "re-formed" (the survivors agreed on the committed steps), "admit"
  // (after a committed step, before the group grows by replacements),
  // "feed" and "fed" (on every member of the grown group, around the
  // shards' transfer and comparison, before the ring of copies is
  // re-formed: the step count is known, on a replacement too),
  // "admitted" (the survivors train on the grown group) and "joined" (a
  // replacement's, once it is fed).
  std::function<void(std::string_view phase, std::uint64_t step)> observer;
};

class ShardedResilientTrainer {
 public:
  // `model` the root of a fully sharded model on a group of at least two
  // ranks, `optimizer` over its parameters, `backup` made on both (kept by
  // the caller, alive as long as this trainer). Collective: none; on a
  // replacement (the model's group joined a running one), the feeding
  // (with every member of the grown group), before it returns.
  ShardedResilientTrainer(std::shared_ptr<FullyShardModule> model, ::torch::optim::Optimizer& optimizer,
                          ShardBackup& backup, ShardedResilientOptions options = {});
  ~ShardedResilientTrainer();
  ShardedResilientTrainer(const ShardedResilientTrainer&) = delete;
  ShardedResilientTrainer& operator=(const ShardedResilientTrainer&) = delete;

  // Runs and commits the next step: `loss_of` once per held shard,
  // ascending; taken again after a loss until it commits. Throws what
  // cannot be survived (above), and the user's function's errors.
  StepOutcome step(const std::function<::torch::Tensor(const Shard&)>& loss_of);

  std::uint64_t steps_committed() const;
  // The shards this rank holds now, ascending (its own; and the lost
  // rank's, on its successor after a loss).
  std::vector<int> shards() const;
  // The group the steps run on now: the model's, or the re-formed one.
  ProcessGroup& group() const;
  // The first world rank lost, or -1; every one lost so far, in order.
  int lost_rank() const;
  const std::vector<int>& lost_ranks() const;
  // The parameters of a shard this rank holds (shards()), unit by unit in
  // the model's order, each a unit's flat shard: its own units' shards, or
  // a lost rank's from the copy this rank holds it in. Their memory, which the next
  // step changes: for a checkpoint or a comparison after a loss, when the
  // model's own (sharded_state_dict) no longer holds every shard.
  // InvalidArgument for a shard held elsewhere.
  std::vector<::torch::Tensor> shard_blocks(int shard) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::torch
