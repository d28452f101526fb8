// ShardedResilientTrainer's state, shared by the files that implement it:
// resilient_fsdp.cc (the step, its commit point and the recovery from a
// loss) and resilient_fsdp_admit.cc (replacements fed and admitted).
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp_unit.h"
#include "lockstep/torch/resilient_fsdp.h"
#include "shard_copy.h"
#include "survival.h"
#include "survivor_backup.h"

namespace lockstep::torch {

namespace sharded_resilience {

// "world rank 1", "world ranks 1, 2".
inline std::string world_ranks_named(const std::vector<int>& ranks) {
  return fmt::format("world rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

// Shard s on rank s: the group whole, or grown back to the whole job.
inline std::vector<int> every_shard_home(int shards) {
  std::vector<int> holder;
  for (int shard = 0; shard < shards; ++shard) holder.push_back(shard);
  return holder;
}

}  // namespace sharded_resilience

struct ShardedResilientTrainer::State {
  std::shared_ptr<FullyShardModule> model;
  ::torch::optim::Optimizer* optimizer = nullptr;
  ShardBackup* backup = nullptr;
  ShardedResilientOptions options;
  ProcessGroup* whole = nullptr;            // the model's group
  // The group the steps run on once the model's is not whole: re-formed
  // without the lost ranks, or grown back by replacements (on a
  // replacement, the group it joined, from the start); held steps on it.
  std::shared_ptr<ProcessGroup> reformed;
  int shard_count = 0;
  std::uint64_t committed = 0;
  std::vector<int> lost;        // the world ranks lost, in the order they were
  std::vector<int> holder;      // by shard: its rank of group() (shard s on rank s until a loss)
  // The shards this rank holds for lost ranks, by shard: the backup's copy
  // (its predecessor's, when that was the first lost) or copies the
  // survivors' ring kept (owned by `taken`).
  std::map<int, detail::ShardCopy*> held;
  std::vector<std::unique_ptr<detail::ShardCopy>> taken;
  // After a loss: this rank's own shard as the survivors' ring sends it,
  // and that ring (on `reformed`, of two ranks or more).
  std::unique_ptr<detail::OwnShard> own;
  std::unique_ptr<detail::SurvivorBackup> ring;
  // What the step ran, kept until it commits: whether every gradient it
  // needs to commit is here, and whether it was a held step.
  bool ready = false;
  bool held_ran = false;
  // Replacements: false on one until its peers fed it; set at the commit
  // point when rank 0 saw a replacement waiting for every lost rank, so
  // that every rank grows the group after the same step. Groups an
  // admission replaced are kept until the trainer ends: a replacement
  // that joined by one still holds it (init_process_group gave it).
  bool has_state = true;
  bool admit_pending = false;
  survival::ReplacementLook replacement_look;
  std::vector<std::shared_ptr<ProcessGroup>> superseded;

  detail::FsdpUnit& root() { return model->unit(); }
  ProcessGroup& group() const { return reformed ? *reformed : *whole; }
  void observe(std::string_view phase) const {
    if (options.observer) options.observer(phase, committed);
  }
  double shard_loss(const std::function<::torch::Tensor(const Shard&)>& loss_of, int shard);
  std::vector<double> run_whole(const std::function<::torch::Tensor(const Shard&)>& loss_of);
  std::vector<double> run_held(const std::function<::torch::Tensor(const Shard&)>& loss_of);
  void commit_point();
  void commit();
  void abandon_exchange();
  std::vector<int> recover(const std::exception_ptr& failure);
  std::shared_ptr<ProcessGroup> shrink(const std::exception_ptr& failure);
  std::vector<int> take_over(const ProcessGroup& failed, const std::vector<int>& members);
  void reform_ring();
  std::int64_t whole_job_waiting();
  void admit(StepOutcome& outcome);
  void recover_during_admission(const std::exception_ptr& failure, StepOutcome& outcome);
  struct Feeding {
    int source = 0;                      // the grown group's first member with the state
    std::vector<int> returning;          // the replacements' ranks there, which are their shards
    std::unique_ptr<detail::SurvivorBackup> ring;  // over the whole group, every shard home
  };
  Feeding feed(ProcessGroup& grown);
  void join();
};

}  // namespace lockstep::torch
