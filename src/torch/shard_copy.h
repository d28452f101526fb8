// One logical shard of every unit of a fully sharded model, held apart from
// the units: a rank's copy of its ring predecessor's shard (ShardBackup),
// or a shard it holds for a rank that was lost. Each unit's block is laid
// out as that shard is on its owner (the same offsets, so each piece sits
// where the owner's does and both steps see the same alignment), with a
// gradient block beside it; an optimizer of the user's type steps views of
// the pieces, in groups that mirror the user's, so that stepped with the
// owner's reduced gradients the copy keeps the owner's bits.
#pragma once

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "fsdp_unit.h"
#include "lockstep/process_group.h"
#include "optimizer_state.h"

namespace lockstep::torch::detail {

// A parameter's piece in a unit's shard: parameter `param` of the unit,
// elements [offset, offset + count) of the shard.
struct ShardRange {
  std::size_t param = 0;
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

// The pieces of `unit`'s parameters that shard `shard` holds elements of.
std::vector<ShardRange> pieces_with_elements(const FsdpUnit& unit, int shard);

// The user's parameters (in its groups' order) with elements in shard
// `shard`, and their indices in that order: what a copy of the shard
// holds, piece for piece. InvalidArgument for a parameter that is none of
// the units'.
struct ParamsInShard {
  std::vector<std::size_t> indices;
  std::vector<::torch::Tensor> params;
};
ParamsInShard params_in_shard(const std::vector<FsdpUnit*>& units, const ::torch::optim::Optimizer& user, int shard);

// One message of a ring's exchange: `out` to rank `next` of `group`, `in`
// from rank `prev`, either left out (a side left out on one rank is left
// out on its peer too), the operations appended to `works`. A group runs
// its operations one at a time in the order they were issued, and a large
// send waits for its receiver: were every rank to send first, none would
// ever receive. Even ranks send first, odd ranks receive first (in a ring
// of odd size rank 0 and the last rank are both even: rank 0's send to
// rank 1 goes first, and the ring unwinds from there).
void ring_exchange(ProcessGroup& group, int next, int prev, std::vector<std::shared_ptr<Work>>& works,
                   std::optional<ConstBuffer> out, std::optional<Buffer> in, int tag);

// This rank's own shard of every unit as it goes to the rank keeping its
// copy: the units' shards, and each step the gradients its optimizer
// steps with, from the memory fully_shard left them in where they are laid
// out as the shard (no copy), gathered into a buffer of that layout where
// not.
class OwnShard {
 public:
  OwnShard(const std::vector<FsdpUnit*>& units, int shard);
  bool holds(std::size_t u) const { return !units_[u].own.empty(); }
  const ::torch::Tensor& block(std::size_t u) const { return units_[u].unit->shard(); }
  // One flag per parameter of every unit, in order: whether it has a gradient.
  void flags(std::vector<std::int32_t>& out) const;
  // Unit `u`'s gradients laid out as its shard (holds(u) must be true).
  const ::torch::Tensor& gradients(std::size_t u);
  std::size_t bytes() const;  // the buffers gradients() gathered into

 private:
  struct Unit {
    FsdpUnit* unit = nullptr;
    std::vector<ShardRange> own;
    ::torch::Tensor outgoing;
  };
  std::vector<Unit> units_;
};

class ShardCopy {
 public:
  // `units`: the model's, in its order; `user`: the optimizer over their
  // parameters (InvalidArgument naming one that is none of theirs). The
  // blocks' contents are undefined until written (a receive, a copy).
  ShardCopy(const std::vector<FsdpUnit*>& units, const ::torch::optim::Optimizer& user, int shard);

  int shard() const { return shard_; }
  std::size_t unit_count() const { return units_.size(); }
  // Whether the shard holds an element of unit `u`: where it holds none,
  // its blocks are empty and nothing is sent or received for it.
  bool holds(std::size_t u) const { return !units_[u].kept.empty(); }
  ::torch::Tensor& block(std::size_t u) { return units_[u].block; }
  ::torch::Tensor& gradient_block(std::size_t u) { return units_[u].gradients; }
  // Every unit's block, in the model's order (zeros of the shard's length
  // where the shard holds no element of the unit): what begin_held_step
  // takes. The blocks are the copy's memory, which step() changes.
  std::vector<::torch::Tensor> blocks() const;
  // The pieces, unit by unit, each unit's in the order of its parameters.
  std::vector<::torch::Tensor> pieces() const;
  ::torch::optim::Optimizer& optimizer() { return *optimizer_; }

  // The pieces' gradients: views of the gradient blocks where `flags`
  // (one per parameter of every unit, in order) says the owner's
  // parameter had one, none elsewhere.
  void use_received_gradients(const std::vector<std::int32_t>& flags);
  // The other end: one flag per parameter of every unit, whether the
  // shard has a piece of it with a gradient.
  void flags(std::vector<std::int32_t>& out) const;
  // The gradient blocks copied from `reduced` (one per unit, laid out as
  // the shard, undefined for a unit no backward reached: finish_held_step's
  // blocks); a piece gets a gradient where its unit reduced one for its
  // parameter. InvalidArgument, naming the unit, for a block of another
  // length or dtype, before anything changes.
  void use_reduced_gradients(const std::vector<::torch::Tensor>& reduced, const char* who);
  // The copy's optimizer step, with the user's options of now (a
  // scheduler's); Adam's in one pass where that gives libtorch's bits.
  void step(const ::torch::optim::Optimizer& user);

  // The blocks, gradient blocks and optimizer state, in bytes.
  std::size_t bytes() const;

 private:
  struct Unit {
    FsdpUnit* unit = nullptr;
    std::vector<ShardRange> kept;      // the shard's pieces with elements
    ::torch::Tensor block;             // the shard's elements of the unit
    ::torch::Tensor gradients;         // its reduced gradients
    std::vector<::torch::Tensor> pieces;  // views of `block`, one per kept piece
  };
  int shard_ = 0;
  std::vector<Unit> units_;
  std::unique_ptr<::torch::optim::Optimizer> optimizer_;
  bool fused_adam_ = false;
};

// One slot of a ring's transfer of optimizer state: `mine` (a shard's
// state_table, or null where this rank sends none in the slot) to rank
// `next`, and rank `prev`'s into `kept`'s optimizer (or none): first each
// piece's table entries, then the tensors they name. Waits for both.
void ring_exchange_optimizer_state(ProcessGroup& group, int next, int prev, const StateTable* mine,
                                   ShardCopy* kept, int table_tag, int tensor_tag);

}  // namespace lockstep::torch::detail
