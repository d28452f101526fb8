// Training steps that survive a rank's death in place (docs/faults.md): the
// job goes on in the same processes with fewer ranks, nothing committed is
// lost, and the parameters are bit for bit those of a run without the
// failure.
//
// Work belongs to logical shards, not to processes: each global batch is
// cut into `shards` pieces (by default the group's size at start), and each
// rank holds some of them (at first, rank r holds shard r). The library
// calls the user's function once per shard this rank holds, and reduces
// the shards' gradients in shard order (ProcessGroup::reduce_shards), so
// the averaged gradient has the same bits whatever process computed each
// shard. A step commits (optimizer step, the model's buffers, the step
// count) only once every rank has its reduced gradient (a barrier after the
// reduction); when a rank dies mid-step, the others re-form the group
// (ProcessGroup::shrink), share out its shards, and redo the step from its
// start, or commit it where some rank already had.
//
//   lockstep::torch::ResilientTrainer trainer(model, optimizer, group);
//   while (trainer.steps_committed() < steps)
//     trainer.step([&](const lockstep::torch::Shard& shard) {
//       auto [x, y] = batch_of(shard.index, shard.count, shard.step);  // depends on the shard, not the rank
//       return torch::nll_loss(model->forward(x), y);
//     });
//
// Replacements (lockstep run --on-rank-failure continue --max-replacements
// N): the launcher starts a new process for a rank that died; the same
// program, whose init_process_group joins the running group
// (ProcessGroup::joined()) and whose ResilientTrainer is then fed by its
// peers instead of starting from rank 0's parameters: the step count, the
// shards, the parameters, the buffers and the optimizer's state (compared
// by digest on every rank afterwards: a replacement holds its peers' bytes
// or the job stops). Rank 0 looks for waiting replacements at each commit
// point (a store read at most every 50 ms); once the step has committed,
// the group grows (ProcessGroup::grow) and the shards go back to their
// home ranks, so that the job ends with the bits of a run without the
// failure. A replacement's options.shards and first_step are ignored:
// its peers' count. Its loop runs until steps_committed() reaches the
// job's end, as any rank's does.
//
// The function must compute the shard's loss from the shard's data alone
// (the same whoever calls it) and must not call collectives; before each
// call the trainer restores the model's buffers to the step's start and
// seeds libtorch's default generator from (seed, step, shard), so dropout
// draws the same numbers for a shard wherever it runs. Models whose
// forward needs collectives (SyncBatchNorm), sharded models (fully_shard:
// ShardedResilientTrainer, lockstep/torch/resilient_fsdp.h, is theirs)
// and ZeroRedundancyOptimizer are refused (ConfigError, naming the restart
// they fall back to); on the mpi and nccl backends a rank's death ends the
// job as before (the launcher restarts it).
//
// ZeRO-1 that survives a death (ResilientOptions::shard_optimizer_state):
// the trainer keeps each partition of the optimizer's state (one per
// logical shard) on its owner and on the next rank of the ring, which
// steps it too (the same bits, no message); the owners then broadcast
// their parameters. A dead owner's partitions are taken over from their
// backups, and new backups fed, before the step is redone; the result is
// the unsharded optimizer's, bit for bit. Each rank holds at most twice
// its share of the state (one extra partition) and steps twice its share.
// Where an owner and its backup die together (or the backup is off), the
// trainer names the lost partition and throws: the job restarts from its
// checkpoint, which consolidate_optimizer_state() makes whole first.
//
// Gradients are views of the trainer's flat buffers, as DDP's
// gradient_as_bucket_view makes them: after step() they hold the averaged
// gradient the optimizer stepped with, until the next step overwrites them.
//
// Not thread-safe: one training thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::torch {

// What a call of the user's function computes: logical shard `index` of
// `count`, of global step `step`.
struct Shard {
  int index = 0;
  int count = 1;
  std::uint64_t step = 0;
};

struct ResilientOptions {
  int shards = 0;          // logical shards per step; 0: the group's size at start
  std::uint64_t seed = 0;  // libtorch's generator is seeded from (seed, step, shard) before each shard
  // Steps already committed, for a job resumed from a checkpoint: the step
  // numbers (which the seeds and the user's samples follow) go on from it.
  std::uint64_t first_step = 0;
  // How long survivors wait for a rank that neither answers nor is known
  // to have ended before they go on without it (ProcessGroup::shrink).
  Duration window = std::chrono::seconds(10);
  // The reduction runs in buckets, as DDP's (lockstep::plan_buckets over
  // the parameters in reverse order: a first bucket of at most 1 MiB, then
  // at most this much each), all in flight at once. The bits do not depend
  // on the layout: each element is averaged over the shards in shard order.
  std::size_t bucket_cap_bytes = 25u << 20;
  // ZeRO-1: each rank keeps the optimizer state of its shards' partitions
  // of the parameters only (equal ranges of their elements, a tensor cut
  // where a range ends; exactly libtorch's SGD, Adam, AdamW, Adagrad or
  // RMSprop, ConfigError for another or a subclass), and, with the backup,
  // its ring predecessor's as well, so that one death, or several apart in
  // the ring, loses nothing. The user's optimizer holds no state meanwhile
  // (consolidate_optimizer_state() gives the first rank's all of it).
  bool shard_optimizer_state = false;
  bool optimizer_state_backup = true;
  // Called at each phase of a step, for logs and for tests that kill a
  // rank at an exact point: "shard" (before the user's function, per
  // shard), "reduce" (before the reduction's first bucket), "bucket<k>"
  // (before bucket k's, k >= 1, while the earlier ones are in flight),
  // "buffers" (before the
  // buffers' broadcast), "barrier" (before the commit point), "commit"
  // (past it, before the optimizer step), "committed", "re-form" (before
  // the group re-forms after a loss), "re-formed" (once it stands and
  // the survivors agree on the committed steps), "admit" (after a committed
  // step, or after a re-form that a replacement on its way reached in
  // time, before the group grows by replacements), "feed" and "fed" (on
  // every member, around a replacement's feeding), "admitted" (the grown
  // group stands), and "joined" (a replacement's, once it is fed).
  std::function<void(std::string_view phase, std::uint64_t step)> observer;
};

// What a committed step was.
struct StepOutcome {
  std::uint64_t step = 0;        // its number (committed steps before it)
  std::vector<double> losses;    // each shard this rank computed last, in shard order
  int redone = 0;                // how many times it was started again after a loss
  std::vector<int> lost;         // world ranks lost while it ran
  // From each failure seen to the group re-formed and agreed, summed.
  double recovery_seconds = 0;
  // World ranks whose replacements joined the group during it: after a
  // re-form, before the step ran again (one already started that asked in
  // time: ResilientTrainer::step), or after it committed.
  std::vector<int> joined;
};

class ResilientTrainer {
 public:
  ResilientTrainer(std::shared_ptr<::torch::nn::Module> model, ::torch::optim::Optimizer& optimizer,
                   std::shared_ptr<ProcessGroup> group, ResilientOptions options = {});
  ~ResilientTrainer();
  ResilientTrainer(const ResilientTrainer&) = delete;
  ResilientTrainer& operator=(const ResilientTrainer&) = delete;

  // Runs and commits the next step: `loss_of` once per held shard,
  // ascending; repeated after a loss until the step commits. After a
  // loss, where the launcher has already started a replacement, the
  // members wait for it to ask as long as the step without it would take
  // longer (the last clean step's time, scaled by the most shards a rank
  // now holds), then grow and feed it before the step runs again; one
  // that asks later joins at a commit point. Throws what
  // cannot be survived: this rank left out of the re-formed group, no
  // majority, the backend cannot re-form (mpi, nccl), or an error of the
  // user's function.
  StepOutcome step(const std::function<::torch::Tensor(const Shard&)>& loss_of);

  std::uint64_t steps_committed() const;
  // The shards this rank holds now, ascending.
  std::vector<int> shards() const;
  // The group the trainer runs on now (a new one after each re-form).
  ProcessGroup& group() const;
  // Re-forms so far.
  int generation() const;
  // The reduction's buckets (ResilientOptions::bucket_cap_bytes).
  std::size_t bucket_count() const;
  // Logical shards per step (ResilientOptions::shards, or what a
  // replacement's peers said).
  int shard_count() const;
  // The bytes of optimizer state this rank keeps (sharded: its partitions'
  // and its backups', not what consolidate_optimizer_state lent it).
  std::size_t optimizer_state_bytes() const;

  // With shard_optimizer_state: gives the optimizer of the group's first
  // rank (group().rank() == 0 once it returns) the whole state, for a
  // checkpoint, until the next step. Collective; survives a death as
  // step() does. Without it: nothing to do.
  void consolidate_optimizer_state();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::torch
