// The backup ring re-formed over the survivors of a fully sharded job
// (ShardedResilientTrainer, docs/fsdp.md, "Backup shards"): after a loss,
// each survivor keeps a copy of every shard its ring predecessor in the
// re-formed group holds (its own, and those it took over from lost
// ranks), so that a later loss is covered as the first was: its successor
// holds its shards from these copies. Made on each re-formed group of two
// or more ranks: each rank sends its predecessor's copies the shards'
// parameters and optimizer state once, then every held step the reduced
// gradients, and the copies are stepped as their holders step them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/process_group.h"
#include "shard_copy.h"

namespace lockstep::torch::detail {

class SurvivorBackup {
 public:
  // `group`: the re-formed group (two ranks or more); holder[s]: the rank
  // of it that holds shard s; `own`: this rank's own shard (shard
  // `own_shard`) with `own_params`, the user's parameters with elements in
  // it (in the user's groups' order); `held`: the other shards this rank
  // holds, by shard, each in a copy. Collective over `group`: sends what
  // this rank holds to the next rank, receives its predecessor's.
  SurvivorBackup(ProcessGroup& group, const std::vector<int>& holder, const std::vector<FsdpUnit*>& units,
                 ::torch::optim::Optimizer& user, int own_shard, OwnShard& own,
                 const std::vector<::torch::Tensor>& own_params, const std::map<int, ShardCopy*>& held);
  ~SurvivorBackup();
  SurvivorBackup(const SurvivorBackup&) = delete;
  SurvivorBackup& operator=(const SurvivorBackup&) = delete;

  // After a held step's reductions, the held copies' gradients set
  // (ShardCopy::use_reduced_gradients): every held shard's gradients to
  // the next rank, the predecessor's into the copies; returns when both
  // have ended (a trainer's commit point needs them here).
  void exchange_gradients();
  // After a failure of the group: the exchange waited out, its errors dropped.
  void abandon();
  // The copies stepped with the gradients the exchange brought.
  void step(const ::torch::optim::Optimizer& user);

  // The rank of the group whose shards this rank keeps, and those shards.
  int kept_rank() const { return prev_; }
  // The copies, taken out (the kept rank was lost: this rank holds its
  // shards from now on), ascending by shard.
  std::vector<std::unique_ptr<ShardCopy>> take_copies();

 private:
  // What goes out in slot k: the k-th shard this rank holds.
  struct Outgoing {
    int shard = -1;
    OwnShard* own = nullptr;    // this rank's own shard, or
    ShardCopy* held = nullptr;  // one it holds for a lost rank
    // Unit u's block, and its reduced gradients, as they go out; none
    // where the shard holds no element of the unit.
    std::optional<ConstBuffer> block(std::size_t u) const;
    std::optional<ConstBuffer> gradients(std::size_t u) const;
    void flags(std::vector<std::int32_t>& out) const;
  };
  void exchange_blocks();
  void exchange_optimizer_state(::torch::optim::Optimizer& user, const std::vector<::torch::Tensor>& own_params);

  ProcessGroup* group_ = nullptr;
  int next_ = 0;
  int prev_ = 0;
  std::size_t unit_count_ = 0;
  std::size_t slots_ = 0;  // the most shards any rank holds
  std::vector<Outgoing> outgoing_;
  std::vector<std::unique_ptr<ShardCopy>> kept_;  // the predecessor's shards, ascending
  std::vector<std::vector<std::int32_t>> flags_out_, flags_in_;
  std::vector<std::shared_ptr<Work>> in_flight_;
};

}  // namespace lockstep::torch::detail
