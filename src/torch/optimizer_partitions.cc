// ZeRO-1 inside a ResilientTrainer; see optimizer_partitions.h.
#include "optimizer_partitions.h"

#include <algorithm>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/enforce.h"
#include "libtorch_version.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_state.h"
#include "state_digest.h"

namespace lockstep::torch {
namespace {

// Whole tensors, largest first, each to the partition with the fewest
// elements so far (the lowest index among equals): the same on every rank.
std::vector<std::vector<std::size_t>> partition(const std::vector<::torch::Tensor>& params, int count) {
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<std::vector<std::size_t>> members(static_cast<std::size_t>(count));
  std::vector<std::int64_t> load(static_cast<std::size_t>(count), 0);
  for (std::size_t i : order) {
    const auto lightest = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    members[lightest].push_back(i);
    load[lightest] += params[i].numel();
  }
  for (auto& m : members) std::sort(m.begin(), m.end());
  return members;
}

}  // namespace

OptimizerPartitions::OptimizerPartitions(::torch::optim::Optimizer& optimizer, int count, bool backup,
                                         bool keeps_state)
    : optimizer_(optimizer), params_(params_of(optimizer)), backup_(backup) {
  LOCKSTEP_CHECK_ARG(count >= 1, "OptimizerPartitions: at least one partition, not {}", count);
  if (!is_libtorch_optimizer(optimizer))
    throw ConfigError("ResilientTrainer: shard_optimizer_state needs one of libtorch's optimizers (SGD, Adam, AdamW, "
                      "Adagrad, RMSprop), which update each parameter from its own gradient and state; train with "
                      "the optimizer state unsharded (the default) instead");
  members_ = partition(params_, count);
  kept_.assign(members_.size(), keeps_state);
  if (!keeps_state) optimizer_.state().clear();
}

std::vector<int> OptimizerPartitions::keeper_world_ranks(std::size_t p) const {
  std::vector<int> out;
  if (world_ranks_.empty()) return out;
  out.push_back(world_ranks_[static_cast<std::size_t>(owner_[p])]);
  if (backup_of_[p] >= 0) out.push_back(world_ranks_[static_cast<std::size_t>(backup_of_[p])]);
  return out;
}

void OptimizerPartitions::place(ProcessGroup& group, const std::vector<int>& holder) {
  const auto count = members_.size();
  const auto size = static_cast<std::size_t>(group.size());
  LOCKSTEP_ENFORCE(holder.size() == count, "OptimizerPartitions: {} shards for {} partitions", holder.size(), count);
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
      throw Error(fmt::format("ResilientTrainer: the optimizer state of partition {} (parameters {}) was kept by {}; "
                              "the state is gone, so the job restarts from its last checkpoint (lockstep run "
                              "--on-rank-failure continue --max-restarts N)",
                              p, fmt::join(members_[p], ","), kept_by));
    }
    const bool lacking = !keeps(owner[p], p) || (backup[p] >= 0 && !keeps(backup[p], p));
    if (lacking && !members_[p].empty()) broadcast_optimizer_state(group, optimizer_, source, &members_[p]);
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
    if (kept_[p]) digest[p] = static_cast<std::int64_t>(digest_of(optimizer_, kDigestStart, &members_[p]));
  group.allgather(ConstBuffer{digest.data(), count, DType::i64}, Buffer{digests.data(), digests.size(), DType::i64})
      ->wait();
  for (std::size_t p = 0; p < count; ++p) {
    if (backup[p] < 0) continue;
    const auto at = [&](int rank) { return digests[static_cast<std::size_t>(rank) * count + p]; };
    if (at(owner[p]) != at(backup[p]))
      throw Error(fmt::format("ResilientTrainer: the optimizer state of partition {} differs between its owner (world "
                              "rank {}) and its backup (world rank {}); a backup that drifted would restore a wrong "
                              "state silently, so the job stops here",
                              p, world_ranks_[static_cast<std::size_t>(owner[p])],
                              world_ranks_[static_cast<std::size_t>(backup[p])]));
  }
}

void OptimizerPartitions::step() {
  if (holds_foreign_state_) drop_state_not_kept();
  std::vector<::torch::Tensor> set_aside(params_.size());
  for (std::size_t p = 0; p < members_.size(); ++p)
    if (!kept_[p])
      for (std::size_t i : members_[p]) {
        set_aside[i] = params_[i].grad();
        params_[i].mutable_grad() = ::torch::Tensor();  // libtorch's optimizers skip a parameter without one
      }
  optimizer_.step();
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (set_aside[i].defined()) params_[i].mutable_grad() = set_aside[i];
  parameters_stale_ = true;
}

void OptimizerPartitions::share_parameters(ProcessGroup& group) {
  if (!parameters_stale_) return;
  for (std::size_t p = 0; p < members_.size(); ++p) {
    broadcast_coalesced(group, tensors_of(p), owner_[p]);
  }
  parameters_stale_ = false;
}

void OptimizerPartitions::consolidate(ProcessGroup& group, int root) {
  for (std::size_t p = 0; p < members_.size(); ++p) {
    if (members_[p].empty()) continue;
    broadcast_optimizer_state(group, optimizer_, owner_[p], &members_[p]);
    if (group.rank() != root) drop_state_not_kept();
  }
  holds_foreign_state_ = group.rank() == root;
}

std::size_t OptimizerPartitions::kept_state_bytes() const {
  std::vector<std::size_t> kept;
  for (std::size_t p = 0; p < members_.size(); ++p)
    if (kept_[p]) kept.insert(kept.end(), members_[p].begin(), members_[p].end());
  return state_bytes(optimizer_, &kept);
}

std::vector<::torch::Tensor> OptimizerPartitions::tensors_of(std::size_t partition) const {
  std::vector<::torch::Tensor> tensors;
  for (std::size_t i : members_[partition]) tensors.push_back(params_[i]);
  return tensors;
}

void OptimizerPartitions::drop_state_not_kept() {
  auto& state = optimizer_.state();
  for (std::size_t p = 0; p < members_.size(); ++p)
    if (!kept_[p])
      for (std::size_t i : members_[p]) state.erase(libtorch::optimizer_state_key(params_[i]));
  holds_foreign_state_ = false;
}

}  // namespace lockstep::torch
