// ZeRO-1 inside a ResilientTrainer (ResilientOptions::shard_optimizer_state):
// the parameters are cut into one partition per logical shard (whole
// tensors, largest first, each to the partition with the fewest elements
// so far: the same on every rank), and a partition's optimizer state lives
// on its owner (the holder of the shard of the same index) and, with the
// backup on, on the next rank of the group's ring too. Every rank holds
// the whole averaged gradient, so a rank steps each partition it keeps
// (owned or backed up: the backup steps it as the owner does, the same
// bits, with no message), and the owners then broadcast their partitions'
// parameters. After a death the survivors place the partitions again: a
// partition whose owner died is taken over from its backup, new backups
// are sent their state, and every keeper's copy is compared by digest; a
// partition whose every keeper died is named and the job falls back to
// its checkpoint. The optimizer's step updates each parameter from its own
// gradient and state (libtorch's SGD, Adam, AdamW, Adagrad, RMSprop), so
// the bits are the unsharded optimizer's whoever steps a partition.
// Not thread-safe: the trainer's thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::torch {

class OptimizerPartitions {
 public:
  // `keeps_state`: whether this rank's optimizer holds the current state of
  // every parameter (a rank at start: fresh, or loaded from a checkpoint),
  // or of none (a replacement).
  OptimizerPartitions(::torch::optim::Optimizer& optimizer, int count, bool backup, bool keeps_state);

  // On a group just formed, every member: owners from `holder` (shard ->
  // group rank), backups the next ranks; the state moved to whoever must
  // keep it and dropped elsewhere; every partition's parameters from one
  // of its keepers; the keepers' copies compared. Throws Error naming the
  // partition and its lost keepers where none survived, or where copies
  // differ.
  void place(ProcessGroup& group, const std::vector<int>& holder);

  // Runs the optimizer's step on the partitions this rank keeps, with the
  // gradients the parameters hold; the others' are left undefined meanwhile.
  void step();

  // The owners' parameters to every rank, after step(). Collective.
  void share_parameters(ProcessGroup& group);

  // Every partition's state to the group's rank `root`, whose optimizer
  // then holds the whole state (for a checkpoint) until the next step.
  void consolidate(ProcessGroup& group, int root);

  // The bytes of the state of the partitions this rank keeps (not what
  // consolidate() lent it).
  std::size_t kept_state_bytes() const;

 private:
  void drop_state_not_kept();
  std::vector<int> keeper_world_ranks(std::size_t partition) const;
  // The parameters of one partition, as broadcast from its keeper.
  std::vector<::torch::Tensor> tensors_of(std::size_t partition) const;

  ::torch::optim::Optimizer& optimizer_;
  std::vector<::torch::Tensor> params_;
  std::vector<std::vector<std::size_t>> members_;  // partition -> parameter indices
  bool backup_;
  std::vector<bool> kept_;            // partition -> whether this rank holds its current state
  std::vector<int> owner_, backup_of_;  // partition -> group rank (-1: none)
  std::vector<int> world_ranks_;      // of the group the partitions were last placed on
  bool parameters_stale_ = false;
  bool holds_foreign_state_ = false;  // after consolidate(): state of partitions it does not keep
};

}  // namespace lockstep::torch
