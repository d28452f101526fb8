// A step of fully_shard's units over several logical shards, on the group
// re-formed after a rank's death (FsdpUnit::begin_held_step and
// finish_held_step; docs/fsdp.md, "Backup shards"): every unit gathered
// once from the blocks this rank holds, each held shard's backward keeping
// its gradients apart, then one reduce-scatter over the logical shards
// per unit, in shard order, the bits of the full group's step.
#include <fmt/format.h>

#include "comm/shard_map.h"
#include "fsdp_unit.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch::detail {

using ::torch::Tensor;

void FsdpUnit::begin_held_step(std::shared_ptr<ProcessGroup> group, std::vector<int> holder, int own_shard,
                               const std::vector<std::vector<Tensor>>& other_blocks) {
  auto& step = *step_;
  if (!is_root())
    throw InvalidArgument(fmt::format("fully_shard: begin_held_step on unit {}: call it on the root unit", name_));
  if (step.held || step.in_step)
    throw InvalidArgument("fully_shard: begin_held_step during a step: call it before the step's first forward, "
                          "and finish_held_step after its last backward");
  if (!group) throw InvalidArgument("fully_shard: begin_held_step needs the group the survivors re-formed");
  const auto shards = static_cast<int>(holder.size());
  if (shards != layout_.world_size() || own_shard < 0 || own_shard >= shards ||
      holder[static_cast<std::size_t>(own_shard)] != group->rank())
    throw InvalidArgument(fmt::format(
        "fully_shard: begin_held_step with a map of {} shards whose shard {} is not held by this rank ({} of the "
        "re-formed group): the units have {} shards, one per rank of the group they were made on, and this rank "
        "keeps holding its own",
        shards, own_shard, group->rank(), layout_.world_size()));
  if (other_blocks.size() != step.units.size())
    throw InvalidArgument(fmt::format("fully_shard: begin_held_step got blocks for {} units; the model has {}",
                                      other_blocks.size(), step.units.size()));
  std::vector<int> held = shards_held(holder, group->rank());
  for (std::size_t k = 0; k < step.units.size(); ++k)
    step.units[k]->check_held_blocks(static_cast<int>(held.size()) - 1, other_blocks[k]);
  step.held = FsdpStep::HeldShards{std::move(group), std::move(holder), std::move(held), own_shard};
  for (std::size_t k = 0; k < step.units.size(); ++k) step.units[k]->gather_held(other_blocks[k]);
}

void FsdpUnit::check_held_blocks(int taken_over, const std::vector<Tensor>& blocks) const {
  if (alone_ || state_ != State::sharded)
    throw InvalidArgument(fmt::format(
        "fully_shard: begin_held_step: unit {} is {}; a held step starts from every unit's shard", name_,
        alone_ ? "a world of one" : "gathered (unshard()): reshard() it first"));
  if (accumulated_.defined())
    throw InvalidArgument(fmt::format(
        "fully_shard: begin_held_step: unit {} keeps gradients of steps without gradient sync, and the lost "
        "rank's part of them is gone: go on in place only at a step that synchronises gradients, or restart",
        name_));
  if (static_cast<int>(blocks.size()) != taken_over)
    throw InvalidArgument(fmt::format("fully_shard: begin_held_step: unit {} got {} blocks for the {} shards this "
                                      "rank took over",
                                      name_, blocks.size(), taken_over));
  for (const Tensor& block : blocks)
    if (!block.is_contiguous() || block.numel() != layout_.shard_elements() || block.scalar_type() != dtype_ ||
        block.device() != shard_.device())
      throw InvalidArgument(fmt::format(
          "fully_shard: begin_held_step: a block of unit {} is {} elements of {} on {}; each must be a contiguous "
          "shard of {} elements of {} on {}",
          name_, block.numel(), c10::toString(block.scalar_type()), block.device().str(), layout_.shard_elements(),
          c10::toString(dtype_), shard_.device().str()));
}

// The unit whole from the blocks of the shards this rank holds.
void FsdpUnit::gather_held(const std::vector<Tensor>& blocks) {
  const auto& held = *step_->held;
  allocate_full();
  std::vector<Tensor> inputs;
  std::vector<ConstBuffer> buffers;
  auto next_block = blocks.begin();
  for (int shard : held.shards) {
    const Tensor& block = shard == held.own_shard ? shard_ : *next_block++;
    inputs.push_back(block.scalar_type() == compute_dtype_ ? block : block.to(compute_dtype_));
    buffers.push_back(buffer_of(inputs.back(), "fully_shard's held shard"));
  }
  auto work = held.group->allgather_shards(std::move(buffers), held.holder, buffer_of(full_, "fully_shard's unit"));
  wait_named(*work, "all-gather");
  state_ = State::unsharded;
  use_unsharded();
}

void FsdpUnit::end_held_backward() {
  backward_prepared_ = false;
  reduced_ = false;
  gradients_ready_ = 0;
}

void FsdpUnit::abandon_step() {
  if (!is_root())
    throw InvalidArgument(fmt::format("fully_shard: abandon_step on unit {}: call it on the root unit", name_));
  for (FsdpUnit* unit : step_->units) unit->abandon();
  step_->reducing.clear();
  step_->held.reset();
  step_->in_step = false;
  step_->backward_queued = false;
}

void FsdpUnit::abandon() {
  const auto settle = [](std::shared_ptr<Work> work) {
    if (!work) return;
    try {
      work->wait();
    } catch (const std::exception&) {
      // The failure the caller already saw, or another of the same group.
    }
  };
  settle(std::move(gather_work_));
  gather_input_ = Tensor();
  settle(std::move(pending_.work));
  pending_ = PendingReduce{};
  reduced_shard_ = Tensor();
  held_flats_.clear();
  if (state_ == State::gathering) state_ = State::unsharded;  // its gather settled above
  if (state_ != State::sharded) use_sharded();
  // Whole gradients of this step's backward, if any, are dropped with it.
  if (stashed_)
    for (std::size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = stash_[i];
  stash_.clear();
  stashed_ = false;
  had_gradient_.assign(params_.size(), false);
  end_held_backward();
}

std::vector<std::vector<Tensor>> FsdpUnit::finish_held_step() {
  auto& step = *step_;
  if (!is_root() || !step.held)
    throw InvalidArgument("fully_shard: finish_held_step without begin_held_step: call both on the root unit");
  if (step.in_step)
    throw InvalidArgument("fully_shard: finish_held_step after a forward whose backward has not run");
  std::vector<std::vector<Tensor>> taken_over;
  for (FsdpUnit* unit : step.units) taken_over.push_back(unit->reduce_held());
  agree_on_used_parameters();
  step.held.reset();
  for (FsdpUnit* unit : step.units) unit->return_to_shards();
  return taken_over;
}

// The unit's gradients of every held shard's backward reduced over the
// logical shards: its own shard's into reduced_shard_, as a reduce-scatter
// leaves it; the taken-over shards' returned.
std::vector<Tensor> FsdpUnit::reduce_held() {
  const auto& held = *step_->held;
  const std::vector<Tensor> flats = std::move(held_flats_);
  held_flats_.clear();
  if (flats.empty()) return {};  // no backward reached the unit
  if (flats.size() != held.shards.size())
    throw Error(fmt::format(
        "fully_shard: unit {} got gradients in {} of the {} backwards of the shards this rank holds: each held "
        "shard's forward and backward must run the same units",
        name_, flats.size(), held.shards.size()));
  std::vector<ConstBuffer> inputs;
  for (const Tensor& flat : flats) inputs.push_back(buffer_of(flat, "fully_shard's gradients"));
  std::vector<Tensor> outputs;
  std::vector<Buffer> buffers;
  for (std::size_t j = 0; j < held.shards.size(); ++j) {
    outputs.push_back(::torch::empty({layout_.shard_elements()}, flats.front().options()));
    buffers.push_back(buffer_of(outputs.back(), "fully_shard's reduced shard"));
  }
  auto work = held.group->reduce_scatter_shards(std::move(inputs), held.holder, std::move(buffers), ReduceOp::avg);
  wait_named(*work, "reduce-scatter");
  std::vector<Tensor> others;
  for (std::size_t j = 0; j < held.shards.size(); ++j) {
    Tensor block = outputs[j].scalar_type() == dtype_ ? outputs[j] : outputs[j].to(dtype_);
    if (held.shards[j] == held.own_shard) reduced_shard_ = std::move(block);
    else others.push_back(std::move(block));
  }
  return others;
}

}  // namespace lockstep::torch::detail
