// ZeRO-1 inside a ResilientTrainer; see optimizer_partitions.h.
#include "optimizer_partitions.h"

#include <algorithm>
#include <string>
#include <typeinfo>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/enforce.h"
#include "libtorch_version.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_state.h"
#include "state_digest.h"
#include "zero_pieces.h"

namespace lockstep::torch {
namespace {

namespace optim = ::torch::optim;
using ::torch::Tensor;

// The pieces at least this large go in their own memory when the owners
// share their parameters (broadcast_coalesced packs the smaller ones).
constexpr std::size_t kSharedInPlaceBytes = 64 << 10;

Tensor gradient_of(const Tensor& param, const detail::ZeroPiece& piece) {
  const Tensor& grad = param.grad();
  return grad.defined() ? grad.detach().reshape({-1}).narrow(0, piece.begin, piece.count) : Tensor();
}

}  // namespace

OptimizerPartitions::OptimizerPartitions(optim::Optimizer& optimizer, int count, bool backup, bool keeps_state)
    : user_(optimizer), params_(params_of(optimizer)), backup_(backup) {
  LOCKSTEP_CHECK_ARG(count >= 1, "OptimizerPartitions: at least one partition, not {}", count);
  if (!zero_pieces::steps_elementwise(optimizer))
    throw ConfigError("ResilientTrainer: shard_optimizer_state needs exactly one of libtorch's SGD, Adam, AdamW, "
                      "Adagrad or RMSprop (not a subclass), which update each element from its own gradient and "
                      "state, so that a tensor's elements may be stepped in pieces on different ranks; train with "
                      "the optimizer state unsharded (the default) instead");
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].is_contiguous())
      throw ConfigError(fmt::format("ResilientTrainer: shard_optimizer_state steps contiguous ranges of each "
                                    "parameter's elements, and parameter {} (sizes {}) is not contiguous; make it "
                                    "contiguous before building the optimizer",
                                    i, params_[i].sizes()));
    numels.push_back(params_[i].numel());
  }
  pieces_ = zero_pieces::partition_balanced(numels, count);
  members_.assign(static_cast<std::size_t>(count), {});
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& piece = pieces_[k];
    piece_tensors_.push_back(params_[piece.param].detach().view({-1}).narrow(0, piece.begin, piece.count)
                                 .requires_grad_(params_[piece.param].requires_grad()));
    members_[static_cast<std::size_t>(piece.owner)].push_back(k);
  }
  // The inner optimizer's groups: the user's, each parameter's pieces in
  // its place (pieces are in parameter order, and so are the groups').
  std::vector<optim::OptimizerParamGroup> groups;
  std::size_t k = 0, param = 0;
  for (const auto& group : user_.param_groups()) {
    std::vector<Tensor> views;
    param += group.params().size();
    for (; k < pieces_.size() && pieces_[k].param < param; ++k) views.push_back(piece_tensors_[k]);
    groups.emplace_back(std::move(views), group.options().clone());
  }
  inner_ = zero_pieces::same_type(user_, std::move(groups));
  kept_.assign(members_.size(), keeps_state);
  if (keeps_state) take_state_from_user_optimizer();
  user_.state().clear();
}

void OptimizerPartitions::take_state_from_user_optimizer() {
  auto& from = user_.state();
  auto& to = inner_->state();
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const auto it = from.find(libtorch::optimizer_state_key(params_[pieces_[k].param]));
    if (it == from.end()) continue;
    to[libtorch::optimizer_state_key(piece_tensors_[k])] =
        zero_pieces::slice_state(*it->second, pieces_[k].begin, pieces_[k].count);
  }
}

void OptimizerPartitions::give_whole_state_to_user_optimizer() {
  auto& to = user_.state();
  const auto& from = inner_->state();
  to.clear();
  for (std::size_t first = 0; first < pieces_.size();) {
    std::size_t end = first;
    std::vector<const optim::OptimizerParamState*> states;
    for (; end < pieces_.size() && pieces_[end].param == pieces_[first].param; ++end) {
      const auto it = from.find(libtorch::optimizer_state_key(piece_tensors_[end]));
      if (it != from.end()) states.push_back(it->second.get());
    }
    const Tensor& param = params_[pieces_[first].param];
    // A parameter never stepped has no state in any piece; one stepped has
    // it in every piece (they step together).
    if (!states.empty() && states.size() == end - first)
      to[libtorch::optimizer_state_key(param)] = zero_pieces::merge_states(states, param.sizes());
    first = end;
  }
}

// The user's groups' options (a scheduler's learning rate) to the
// optimizer that steps the pieces.
void OptimizerPartitions::take_user_options() {
  zero_pieces::copy_options(user_.param_groups(), inner_->param_groups());
}

std::vector<int> OptimizerPartitions::keeper_world_ranks(std::size_t p) const {
  std::vector<int> out;
  if (world_ranks_.empty()) return out;
  out.push_back(world_ranks_[static_cast<std::size_t>(owner_[p])]);
  if (backup_of_[p] >= 0) out.push_back(world_ranks_[static_cast<std::size_t>(backup_of_[p])]);
  return out;
}

std::string OptimizerPartitions::describe(std::size_t p) const {
  std::vector<std::string> parts;
  for (std::size_t k : members_[p]) {
    const Piece& piece = pieces_[k];
    if (piece.count == params_[piece.param].numel())
      parts.push_back(fmt::format("{}", piece.param));
    else
      parts.push_back(fmt::format("{}[{}:{}]", piece.param, piece.begin, piece.begin + piece.count));
  }
  return fmt::format("parameters {}", fmt::join(parts, ", "));
}

void OptimizerPartitions::place(ProcessGroup& group, const std::vector<int>& holder) {
  const auto count = members_.size();
  const auto size = static_cast<std::size_t>(group.size());
  LOCKSTEP_ENFORCE(holder.size() == count, "OptimizerPartitions: {} shards for {} partitions", holder.size(), count);
  if (holds_foreign_state_) drop_state_not_kept();
  // A replacement's were fed just now; the others' must match them before
  // the digests below compare the learning rates.
  take_user_options();
  // 1. Which partitions each member keeps now.
  std::vector<std::int64_t> mine(count), all(count * size);
  for (std::size_t p = 0; p < count; ++p) mine[p] = kept_[p] ? 1 : 0;
  group.allgather(ConstBuffer{mine.data(), count, DType::i64}, Buffer{all.data(), all.size(), DType::i64})->wait();
  const auto keeps = [&](int rank, std::size_t p) { return all[static_cast<std::size_t>(rank) * count + p] != 0; };

  // 2. Every partition's state to its new keepers, from one that has it,
  // and its parameters to every member from the same.
  std::vector<int> owner(count), backup(count, -1);
  for (std::size_t p = 0; p < count; ++p) {
    owner[p] = holder[p];
    if (backup_ && size > 1) backup[p] = (owner[p] + 1) % static_cast<int>(size);
    int source = -1;
    for (int r = 0; r < static_cast<int>(size) && source < 0; ++r)
      if (keeps(r, p)) source = r;
    if (source < 0) {
      const std::vector<int> keepers = keeper_world_ranks(p);
      const std::string kept_by =
          keepers.size() == 1 ? fmt::format("world rank {} alone (the backup is off: "
                                            "ResilientOptions::optimizer_state_backup), and it is lost",
                                            keepers[0])
                              : fmt::format("world ranks {} only, and all are lost", fmt::join(keepers, " and "));
      throw Error(fmt::format("ResilientTrainer: the optimizer state of partition {} ({}) was kept by {}; "
                              "the state is gone, so the job restarts from its last checkpoint (lockstep run "
                              "--on-rank-failure continue --max-restarts N)",
                              p, describe(p), kept_by));
    }
    const bool lacking = !keeps(owner[p], p) || (backup[p] >= 0 && !keeps(backup[p], p));
    if (lacking && !members_[p].empty()) broadcast_optimizer_state(group, *inner_, source, &members_[p]);
    kept_[p] = group.rank() == owner[p] || group.rank() == backup[p];
    broadcast_coalesced(group, tensors_of(p), source);
  }
  owner_ = owner;
  backup_of_ = backup;
  world_ranks_ = group.world_ranks();
  drop_state_not_kept();
  parameters_stale_ = false;

  // 3. The keepers' copies, compared: a backup that drifted from its
  // owner would hand a wrong state to the next survivor silently.
  std::vector<std::int64_t> digest(count, 0), digests(count * size);
  for (std::size_t p = 0; p < count; ++p)
    if (kept_[p]) digest[p] = static_cast<std::int64_t>(digest_of(*inner_, kDigestStart, &members_[p]));
  group.allgather(ConstBuffer{digest.data(), count, DType::i64}, Buffer{digests.data(), digests.size(), DType::i64})
      ->wait();
  for (std::size_t p = 0; p < count; ++p) {
    if (backup[p] < 0) continue;
    const auto at = [&](int rank) { return digests[static_cast<std::size_t>(rank) * count + p]; };
    if (at(owner[p]) != at(backup[p]))
      throw Error(fmt::format("ResilientTrainer: the optimizer state of partition {} ({}) differs between its owner "
                              "(world rank {}) and its backup (world rank {}); a backup that drifted would restore a "
                              "wrong state silently, so the job stops here",
                              p, describe(p), world_ranks_[static_cast<std::size_t>(owner[p])],
                              world_ranks_[static_cast<std::size_t>(backup[p])]));
  }
}

void OptimizerPartitions::step() {
  if (holds_foreign_state_) drop_state_not_kept();
  take_user_options();
  for (std::size_t p = 0; p < members_.size(); ++p) {
    if (!kept_[p]) continue;  // libtorch's optimizers skip a parameter without a gradient
    for (std::size_t k : members_[p]) piece_tensors_[k].mutable_grad() = gradient_of(params_[pieces_[k].param], pieces_[k]);
  }
  inner_->step();
  // The views of the gradients would keep the reduced buffer's memory.
  for (auto& t : piece_tensors_) t.mutable_grad().reset();
  parameters_stale_ = true;
}

void OptimizerPartitions::share_parameters(ProcessGroup& group) {
  if (!parameters_stale_) return;
  // Every step: a piece of a partition is a quarter of a large weight at 4
  // ranks, and packing it would copy it twice on every rank.
  for (std::size_t p = 0; p < members_.size(); ++p)
    broadcast_coalesced(group, tensors_of(p), owner_[p], kSharedInPlaceBytes);
  parameters_stale_ = false;
}

void OptimizerPartitions::consolidate(ProcessGroup& group, int root) {
  for (std::size_t p = 0; p < members_.size(); ++p) {
    if (members_[p].empty()) continue;
    broadcast_optimizer_state(group, *inner_, owner_[p], &members_[p]);
    if (group.rank() != root) drop_state_not_kept();
  }
  if (group.rank() == root) give_whole_state_to_user_optimizer();
  holds_foreign_state_ = group.rank() == root;
}

std::size_t OptimizerPartitions::kept_state_bytes() const {
  std::vector<std::size_t> kept;
  for (std::size_t p = 0; p < members_.size(); ++p)
    if (kept_[p]) kept.insert(kept.end(), members_[p].begin(), members_[p].end());
  return state_bytes(*inner_, &kept);
}

std::vector<Tensor> OptimizerPartitions::tensors_of(std::size_t partition) const {
  std::vector<Tensor> tensors;
  for (std::size_t k : members_[partition]) tensors.push_back(piece_tensors_[k]);
  return tensors;
}

// What this rank does not keep, out of the inner optimizer, and the whole
// state consolidate() lent the user's optimizer.
void OptimizerPartitions::drop_state_not_kept() {
  auto& state = inner_->state();
  for (std::size_t p = 0; p < members_.size(); ++p)
    if (!kept_[p])
      for (std::size_t k : members_[p]) state.erase(libtorch::optimizer_state_key(piece_tensors_[k]));
  if (holds_foreign_state_) user_.state().clear();
  holds_foreign_state_ = false;
}

}  // namespace lockstep::torch
