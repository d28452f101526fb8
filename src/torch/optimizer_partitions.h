// ZeRO-1 inside a ResilientTrainer (ResilientOptions::shard_optimizer_state):
// the parameters, laid end to end, are cut into one partition of equal
// elements per logical shard (DeepSpeed ZeRO-1's layout, as
// ZeroPartition::balanced_elements: a tensor crossing a boundary is
// stepped in pieces), and a partition's optimizer state lives on its owner
// (the holder of the shard of the same index) and, with the backup on, on
// the next rank of the group's ring too. So each rank keeps 1/N of the
// state and, with the backup, one more partition: never a dominant tensor's
// whole state on two ranks. Every rank holds the whole averaged gradient,
// so a rank steps each partition it keeps (owned or backed up: the backup
// steps it as the owner does, the same bits, with no message), and the
// owners then broadcast their partitions' parameters. After a death the
// survivors place the partitions again: a partition whose owner died is
// taken over from its backup, new backups are sent their state, and every
// keeper's copy is compared by digest; a partition whose every keeper died
// is named and the job falls back to its checkpoint.
//
// The pieces are stepped by an optimizer of the user's optimizer's type
// over flat views of the parameters' elements (one per piece, grouped as
// the user's groups, their options copied from them at every step, so a
// scheduler still drives them), which holds the state; the user's optimizer
// holds none, except after consolidate() on its root, where it holds the
// whole state (what the unsharded optimizer would: a checkpoint of it
// loads into an unsharded run). Only optimizers that update each element
// from its own gradient and state may be cut so: exactly SGD, Adam, AdamW,
// Adagrad or RMSprop; the bits are the unsharded optimizer's whoever steps
// a partition. Not thread-safe: the trainer's thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/zero.h"

namespace lockstep::torch {

class OptimizerPartitions {
 public:
  // `keeps_state`: whether `optimizer` holds the current state of every
  // parameter (a rank at start: fresh, or loaded from a checkpoint), which
  // this rank then keeps (until place() drops what it does not keep), or
  // of none (a replacement). Either way `optimizer` holds no state after.
  // Throws ConfigError for an optimizer that cannot be cut, or a
  // parameter that is not contiguous.
  OptimizerPartitions(::torch::optim::Optimizer& optimizer, int count, bool backup, bool keeps_state);

  // On a group just formed, every member: owners from `holder` (shard ->
  // group rank), backups the next ranks; the state moved to whoever must
  // keep it and dropped elsewhere; every partition's parameters from one
  // of its keepers; the keepers' copies compared. Throws Error naming the
  // partition and its lost keepers where none survived, or where copies
  // differ.
  void place(ProcessGroup& group, const std::vector<int>& holder);

  // Runs the optimizer's step on the partitions this rank keeps, with the
  // gradients the parameters hold and the user's optimizer's options.
  void step();

  // The owners' parameters to every rank, after step(). Collective.
  void share_parameters(ProcessGroup& group);

  // Every partition's state to the group's rank `root`, whose user
  // optimizer then holds the whole state, as the unsharded optimizer
  // would (for a checkpoint), until the next step.
  void consolidate(ProcessGroup& group, int root);

  // The bytes of the state of the partitions this rank keeps (not what
  // consolidate() lent it).
  std::size_t kept_state_bytes() const;

 private:
  using Piece = detail::ZeroPiece;

  void drop_state_not_kept();
  std::vector<int> keeper_world_ranks(std::size_t partition) const;
  // "parameters 0, 3[0:100]": the parameters (and cut ranges) of a partition.
  std::string describe(std::size_t partition) const;
  // The pieces' views of one partition, as broadcast from its keeper.
  std::vector<::torch::Tensor> tensors_of(std::size_t partition) const;
  void take_user_options();
  void take_state_from_user_optimizer();
  void give_whole_state_to_user_optimizer();

  ::torch::optim::Optimizer& user_;
  std::vector<::torch::Tensor> params_;        // the user's optimizer's, in its groups' order
  std::vector<Piece> pieces_;                  // by parameter, then by first element; owner = partition
  std::vector<::torch::Tensor> piece_tensors_;  // flat views of the parameters' elements
  std::unique_ptr<::torch::optim::Optimizer> inner_;  // over piece_tensors_: holds the kept state
  std::vector<std::vector<std::size_t>> members_;     // partition -> piece indices
  bool backup_;
  std::vector<bool> kept_;              // partition -> whether this rank holds its current state
  std::vector<int> owner_, backup_of_;  // partition -> group rank (-1: none)
  std::vector<int> world_ranks_;        // of the group the partitions were last placed on
  bool parameters_stale_ = false;
  bool holds_foreign_state_ = false;  // after consolidate() on its root: the user's optimizer holds the whole state
};

}  // namespace lockstep::torch
