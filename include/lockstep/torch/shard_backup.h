// Redundant shards for fully_shard (docs/fsdp.md, "Backup shards"): each
// rank keeps a copy of its ring predecessor's shard of every unit of a
// fully sharded model (rank r keeps rank r-1's, rank 0 the last rank's),
// with that shard's optimizer state, kept current step by step. A rank's
// shard then lives on two ranks, so that one death, or several apart in the
// ring, loses no parameter or optimizer state.
//
//   auto model = lockstep::torch::fully_shard(net, pg);
//   torch::optim::Adam opt(model->parameters(), 1e-3);
//   lockstep::torch::ShardBackup backup(*model, opt);   // before the first step, or after a resume
//   for (...) {
//     opt.zero_grad();
//     loss(model->forward(x), y).backward();
//     backup.send_gradients();                          // optional: overlaps the optimizer's step
//     opt.step();
//     backup.step();                                    // after each step
//   }
//   backup.verify();                                    // every backup holds its predecessor's bytes
//
// How it stays current: step() sends this rank's reduced gradients (the
// ones its optimizer just stepped with) to the next rank, and steps the
// copy it keeps with those its predecessor sent, in an optimizer of the
// same type and options. The optimizer must update each element from its
// own gradient and state (exactly libtorch's SGD, Adam, AdamW, Adagrad or
// RMSprop), so the copy's step gives its owner's bits: no parameter or
// state is sent after the first. Per step that is one shard of gradients
// sent and received (from the memory fully_shard left them in: no copy),
// and one more shard stepped (Adam's in one pass over its memory where
// that gives libtorch's bits, as a probe at construction checks; libtorch's
// own step elsewhere); in memory, one more shard of parameters, of
// gradients and of optimizer state (bytes() says how many).
//
// The model's units reduce their gradients in shard order from then on
// (FullyShardOptions::reduce_in_shard_order; host memory), as a step with
// a shard taken over from the copy does: its bits are then a clean
// step's. On shm that is the fold its reduce-scatter makes anyway.
//
// The trainer that takes a dead rank's shard over from its backup in place
// is ShardedResilientTrainer (lockstep/torch/resilient_fsdp.h); it drives
// the units' begin_held_step and finish_held_step, and kept_blocks and
// step_kept below. Without it a death falls back to the restart from a
// checkpoint.
//
// Collective: every rank makes one and calls step() and verify() at the
// same points. On a replacement that joined a running group
// (ProcessGroup::joined()) it exchanges nothing: ShardedResilientTrainer
// feeds the replacement its shard from its peers, and keeps the copies in
// a ring of its own from then on. Not thread-safe: the training thread.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "lockstep/torch/fully_shard.h"

namespace lockstep::torch {

namespace detail {
class ShardCopy;
}
class ShardedResilientTrainer;

class ShardBackup {
 public:
  // `model` is the root of a fully sharded model (its units' shards are
  // kept) and `optimizer` steps its parameters. ConfigError for an
  // optimizer that cannot be stepped in pieces; InvalidArgument in a group
  // of one rank (no peer to keep a copy). Sends every rank's shards, and
  // the optimizer state it holds for them (after some steps, or loaded from
  // a checkpoint), to the next rank.
  ShardBackup(FullyShardModule& model, ::torch::optim::Optimizer& optimizer);
  ~ShardBackup();
  ShardBackup(const ShardBackup&) = delete;
  ShardBackup& operator=(const ShardBackup&) = delete;

  // Optional, after backward and before the optimizer's step: starts
  // sending this step's gradients to the next rank (and receiving the
  // previous rank's), so that the transfer overlaps the optimizer's step.
  // The gradients must not change until step().
  void send_gradients();
  // Waits until this step's gradients have gone to the next rank and the
  // kept rank's have arrived (sending them first where send_gradients()
  // did not): after it, step() only steps the copy, with no message. A
  // trainer that must know every rank holds what it needs to commit (the
  // commit point of ShardedResilientTrainer) calls it before its barrier.
  void receive_gradients();
  // After the optimizer's step: this step's gradients to the next rank
  // (unless send_gradients() or receive_gradients() sent them), and the
  // copy of the previous rank's shards stepped with its own.
  void step();
  // After a failure of the group: waits out this step's exchange (its
  // errors dropped) and forgets it; the copy is left as it was before the
  // step.
  void abandon_gradients();

  // Whether every rank's copy holds its predecessor's bytes (parameters,
  // then optimizer state), compared by digest on every rank. Throws Error
  // naming the ranks whose copies differ.
  void verify();

  // The group rank whose shards this rank keeps.
  int kept_rank() const;
  // The bytes this rank keeps for it: the copy's parameters, gradients and
  // optimizer state, and the buffer its own gradients leave from.
  std::size_t bytes() const;
  // For tests: the copy's parameter pieces, unit by unit in the model's
  // order, each unit's pieces in the order of its parameters (those with
  // elements in the kept rank's shard).
  std::vector<::torch::Tensor> pieces() const;
  // The copy's optimizer (its state; its groups mirror the user's).
  ::torch::optim::Optimizer& optimizer();

  // After the kept rank's death, while this rank holds its shard in its
  // place (the units' held step, docs/fsdp.md, "Backup shards"). Local:
  // no communication.
  //   kept_blocks: the copy's shard of every unit, in the model's unit
  //     order (the blocks begin_held_step takes; zeros where the kept rank
  //     holds no element of a unit). The copy's own memory: step_kept
  //     changes it in place.
  //   step_kept: the copy stepped with the kept shard's reduced gradients
  //     (one block per unit, as finish_held_step returns them; undefined
  //     for a unit no backward reached), as its owner's optimizer would
  //     step them after zero_grad: a parameter no rank gave a gradient
  //     this step is left as it is.
  std::vector<::torch::Tensor> kept_blocks() const;
  void step_kept(const std::vector<::torch::Tensor>& gradients);

 private:
  // The trainer holds a lost rank's shard in the copy itself.
  friend class ShardedResilientTrainer;
  detail::ShardCopy& kept_copy();

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::torch
