// ShardedResilientTrainer; see lockstep/torch/resilient_fsdp.h. The step's
// parts live in the units (fsdp_held_step.cc) and the backup
// (shard_backup.cc); this file orders them around one commit point and
// recovers from a loss; resilient_fsdp_admit.cc admits replacements.
#include "lockstep/torch/resilient_fsdp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "comm/shard_map.h"
#include "common/enforce.h"
#include "lockstep/error.h"
#include "resilient_fsdp_state.h"
#include "survival.h"

namespace lockstep::torch {

using ::torch::Tensor;
using detail::FsdpUnit;
using sharded_resilience::every_shard_home;
using sharded_resilience::world_ranks_named;

namespace {

// "world rank 1 was", "world ranks 1, 2 were".
std::string were(const std::vector<int>& ranks) {
  return fmt::format("{} {}", world_ranks_named(ranks), ranks.size() == 1 ? "was" : "were");
}

}  // namespace

ShardedResilientTrainer::ShardedResilientTrainer(std::shared_ptr<FullyShardModule> model,
                                                 ::torch::optim::Optimizer& optimizer, ShardBackup& backup,
                                                 ShardedResilientOptions options)
    : state_(std::make_unique<State>()) {
  LOCKSTEP_CHECK_ARG(model != nullptr, "ShardedResilientTrainer: no model");
  if (!model->buffers().empty())
    throw ConfigError(fmt::format(
        "ShardedResilientTrainer: the model has {} buffers (BatchNorm's running statistics: each rank's own "
        "under fully_shard), which a held step would update once per shard it holds; use a model without "
        "buffers (LayerNorm instead of BatchNorm), or train without it and restart from the last checkpoint "
        "when a rank dies (lockstep run --on-rank-failure restart, docs/faults.md)",
        model->buffers().size()));
  State& s = *state_;
  s.whole = &model->group();
  s.shard_count = s.whole->size();
  s.model = std::move(model);
  s.optimizer = &optimizer;
  s.backup = &backup;
  s.options = std::move(options);
  s.committed = s.options.first_step;
  s.holder = every_shard_home(s.shard_count);
  if (s.whole->joined()) s.join();
}

ShardedResilientTrainer::~ShardedResilientTrainer() {
  // The job's work is done (or failed here): a replacement waiting, or
  // started from now on, is told so instead of waiting for a step boundary.
  try {
    if (state_->group().rank() == 0) state_->group().close_to_replacements();
  } catch (const std::exception&) {
    // The store is gone: a replacement waiting times out instead.
  }
  // The ring first (it sends on the group), then the groups, newest first.
  state_->ring.reset();
  state_->reformed.reset();
  while (!state_->superseded.empty()) state_->superseded.pop_back();
}

std::uint64_t ShardedResilientTrainer::steps_committed() const { return state_->committed; }

std::vector<int> ShardedResilientTrainer::shards() const {
  const State& s = *state_;
  return shards_held(s.holder, s.group().rank());
}

ProcessGroup& ShardedResilientTrainer::group() const { return state_->group(); }

int ShardedResilientTrainer::lost_rank() const { return state_->lost.empty() ? -1 : state_->lost.front(); }

const std::vector<int>& ShardedResilientTrainer::lost_ranks() const { return state_->lost; }

std::vector<Tensor> ShardedResilientTrainer::shard_blocks(int shard) const {
  const State& s = *state_;
  if (shard == s.whole->rank()) {
    std::vector<Tensor> blocks;
    for (const FsdpUnit* unit : s.model->unit().step().units) blocks.push_back(unit->shard());
    return blocks;
  }
  if (const auto it = s.held.find(shard); it != s.held.end()) return it->second->blocks();
  throw InvalidArgument(fmt::format("ShardedResilientTrainer: shard {} is not held by this rank (it holds {})", shard,
                                    fmt::join(shards(), ", ")));
}

StepOutcome ShardedResilientTrainer::step(const std::function<Tensor(const Shard&)>& loss_of) {
  State& s = *state_;
  StepOutcome outcome;
  outcome.step = s.committed;
  const std::uint64_t target = s.committed + 1;
  for (;;) {
    std::exception_ptr failure;
    try {
      outcome.losses = s.reformed ? s.run_held(loss_of) : s.run_whole(loss_of);
      s.commit_point();
      s.commit();
      if (s.admit_pending) s.admit(outcome);
      return outcome;
    } catch (const PeerError&) {
      failure = std::current_exception();
    } catch (const TimeoutError&) {
      failure = std::current_exception();  // a rank that stopped answering
    }
    const auto seen = std::chrono::steady_clock::now();
    const std::vector<int> lost_now = s.recover(failure);
    outcome.lost.insert(outcome.lost.end(), lost_now.begin(), lost_now.end());
    outcome.recovery_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count();
    if (s.committed == target) return outcome;  // it had passed the commit point somewhere
    ++outcome.redone;
  }
}

double ShardedResilientTrainer::State::shard_loss(const std::function<Tensor(const Shard&)>& loss_of, int shard) {
  observe("shard");
  ::torch::manual_seed(survival::shard_seed(options.seed, committed, shard));
  Tensor loss = loss_of(Shard{shard, shard_count, committed});
  loss.backward();
  return loss.item<double>();
}

// An ordinary fully sharded step, its gradients then sent to the backup.
std::vector<double> ShardedResilientTrainer::State::run_whole(const std::function<Tensor(const Shard&)>& loss_of) {
  ready = false;
  held_ran = false;
  optimizer->zero_grad();
  const double loss = shard_loss(loss_of, whole->rank());
  observe("backup");
  backup->receive_gradients();
  ready = true;
  return {loss};
}

// A held step on the re-formed group: each lost rank's successor holds its
// shards from its copies. The held shards' reduced gradients go into their
// copies, and every held shard's to the ring's next rank, before the
// commit point.
std::vector<double> ShardedResilientTrainer::State::run_held(const std::function<Tensor(const Shard&)>& loss_of) {
  ready = false;
  held_ran = true;
  optimizer->zero_grad();  // before begin_held_step, which sets the gradients aside as forward does
  std::vector<std::vector<Tensor>> blocks(root().step().units.size());
  for (const auto& [shard, copy] : held) {  // ascending, as begin_held_step takes them
    const std::vector<Tensor> kept = copy->blocks();
    for (std::size_t u = 0; u < kept.size(); ++u) blocks[u].push_back(kept[u]);
  }
  root().begin_held_step(reformed, holder, whole->rank(), blocks);
  std::vector<double> losses;
  for (int shard : shards_held(holder, reformed->rank())) losses.push_back(shard_loss(loss_of, shard));
  const std::vector<std::vector<Tensor>> taken_over = root().finish_held_step();
  std::size_t k = 0;
  for (const auto& [shard, copy] : held) {
    std::vector<Tensor> reduced;
    for (const auto& blocks_of_unit : taken_over)
      reduced.push_back(blocks_of_unit.empty() ? Tensor() : blocks_of_unit[k]);
    copy->use_reduced_gradients(reduced, "ShardedResilientTrainer");
    ++k;
  }
  observe("backup");
  if (ring) ring->exchange_gradients();
  ready = true;
  return losses;
}

// Once any rank has passed it, every rank had reached it: each holds its
// reduced gradients and its copy's. The barrier also carries whether rank
// 0 saw a replacement waiting for every lost rank.
void ShardedResilientTrainer::State::commit_point() {
  observe("barrier");
  std::int64_t waiting = reformed && group().rank() == 0 ? whole_job_waiting() : 0;
  group().allreduce(Buffer{&waiting, 1, DType::i64}, ReduceOp::max)->wait();
  admit_pending = waiting > 0;
}

// Local: the optimizer's step and the copies'.
void ShardedResilientTrainer::State::commit() {
  observe("commit");
  optimizer->step();
  if (!held_ran) {
    backup->step();
  } else {
    for (const auto& [shard, copy] : held) copy->step(*optimizer);
    if (ring) ring->step(*optimizer);
  }
  ready = false;
  ++committed;
  observe("committed");
}

// What a failed step had sent or was receiving, waited out.
void ShardedResilientTrainer::State::abandon_exchange() {
  if (!held_ran)
    backup->abandon_gradients();
  else if (ring)
    ring->abandon();
}

// Re-forms the group without the lost ranks, hands each one's shards to
// its ring successor, agrees on the committed steps, and re-forms the
// backup ring over the survivors. Returns the world ranks lost.
std::vector<int> ShardedResilientTrainer::State::recover(const std::exception_ptr& failure) {
  observe("re-form");
  admit_pending = false;  // a commit point some rank did not pass
  if (!ready) {
    // The failure came mid-step: the shards and the copies are still the step's start.
    root().abandon_step();
    abandon_exchange();
  }
  ProcessGroup& failed = group();
  std::shared_ptr<ProcessGroup> next = shrink(failure);
  const std::vector<int> lost_now = take_over(failed, next->members_of_parent());
  reformed = std::move(next);

  const auto size = static_cast<std::size_t>(reformed->size());
  std::vector<std::int64_t> committed_of(size);
  const auto mine = static_cast<std::int64_t>(committed);
  reformed->allgather(ConstBuffer{&mine, 1, DType::i64}, Buffer{committed_of.data(), size, DType::i64})->wait();
  const std::int64_t highest = *std::max_element(committed_of.begin(), committed_of.end());
  if (highest == mine + 1) {
    if (!ready)
      throw Error(fmt::format("ShardedResilientTrainer: a survivor committed step {} but this rank holds no "
                              "reduced gradients for it; the commit rule was broken",
                              committed));
    commit();  // the step as it ran: its gradients and the copies' are here
  } else if (highest != mine) {
    throw Error(fmt::format("ShardedResilientTrainer: the survivors are {} steps apart; the commit rule was broken",
                            highest - mine));
  } else if (ready) {
    abandon_exchange();  // taken again held: what arrived is dropped
    ready = false;
  }
  observe("re-formed");
  reform_ring();
  return lost_now;
}

// The group re-formed until it stands (each attempt may lose another rank).
std::shared_ptr<ProcessGroup> ShardedResilientTrainer::State::shrink(const std::exception_ptr& failure) {
  ProcessGroup& failed = group();
  std::vector<int> named = survival::named_lost(failure, failed);
  for (int attempt = 0;; ++attempt) {
    try {
      return failed.shrink(named, options.window);
    } catch (const PeerError&) {
      if (attempt >= 16) throw;
      named = survival::named_lost(std::current_exception(), failed);
    } catch (const TimeoutError&) {
      if (attempt >= 16) throw;
      named.clear();
    }
  }
}

// Each lost rank's shards go to its ring successor, which keeps copies of
// them: the backup's copy of its predecessor's shard while the group is
// whole, the survivors' ring's copies after. Two neighbours lost at once,
// or a loss no ring covers, ends the round. Returns the world ranks lost.
std::vector<int> ShardedResilientTrainer::State::take_over(const ProcessGroup& failed,
                                                          const std::vector<int>& members) {
  const int size = failed.size();
  std::vector<bool> gone(static_cast<std::size_t>(size), true);
  for (int m : members) gone[static_cast<std::size_t>(m)] = false;
  std::vector<int> lost_now;
  bool neighbours = false;
  for (int r = 0; r < size; ++r)
    if (gone[static_cast<std::size_t>(r)]) {
      lost_now.push_back(failed.world_ranks()[static_cast<std::size_t>(r)]);
      neighbours = neighbours || gone[static_cast<std::size_t>((r + 1) % size)];
    }
  const bool covered = !reformed || ring != nullptr;
  if (neighbours || !covered) {
    const std::string before = lost.empty() ? std::string() : fmt::format(" after {} lost", were(lost));
    throw Error(fmt::format(
        "ShardedResilientTrainer: {} lost at once{}; each shard has one copy, on the next rank of the ring{}, so "
        "{}: restart from the last checkpoint (lockstep run --max-restarts, docs/faults.md)",
        world_ranks_named(lost_now), before,
        covered ? "" : " (none: the ring was not re-formed)",
        neighbours ? "two neighbours in the ring take a shard and its only copy" : "no copy is left"));
  }

  const int before = failed.rank();
  const int predecessor = (before + size - 1) % size;
  if (gone[static_cast<std::size_t>(predecessor)]) {
    if (!reformed) {
      held[predecessor] = &backup->kept_copy();  // its shard is its rank
    } else {
      for (auto& copy : ring->take_copies()) {
        held[copy->shard()] = copy.get();
        taken.push_back(std::move(copy));
      }
    }
  }
  for (int shard = 0; shard < shard_count; ++shard) {
    int keeper = holder[static_cast<std::size_t>(shard)];
    if (gone[static_cast<std::size_t>(keeper)]) keeper = (keeper + 1) % size;
    holder[static_cast<std::size_t>(shard)] =
        static_cast<int>(std::find(members.begin(), members.end(), keeper) - members.begin());
  }
  ring.reset();  // its copies are of a ring that no longer stands
  lost.insert(lost.end(), lost_now.begin(), lost_now.end());
  return lost_now;
}

// Every survivor keeps copies of what its predecessor in the re-formed
// group holds; a rank lost meanwhile leaves the copies incomplete, which
// nothing can take over from.
void ShardedResilientTrainer::State::reform_ring() {
  if (reformed->size() < 2) return;  // alone: no peer to keep a copy
  std::vector<FsdpUnit*> units = root().units_within();
  if (!own) own = std::make_unique<detail::OwnShard>(units, whole->rank());
  try {
    const std::vector<Tensor> own_params = detail::params_in_shard(units, *optimizer, whole->rank()).params;
    ring = std::make_unique<detail::SurvivorBackup>(*reformed, holder, units, *optimizer, whole->rank(), *own,
                                                    own_params, held);
  } catch (const PeerError& e) {
    throw Error(fmt::format("ShardedResilientTrainer: a rank was lost while the survivors re-formed the backup ring "
                            "after {} lost ({}); its shards have no whole copy: restart from the last checkpoint "
                            "(lockstep run --max-restarts, docs/faults.md)",
                            were(lost), e.what()));
  } catch (const TimeoutError& e) {
    throw Error(fmt::format("ShardedResilientTrainer: a rank stopped answering while the survivors re-formed the "
                            "backup ring after {} lost ({}); restart from the last checkpoint (lockstep run "
                            "--max-restarts, docs/faults.md)",
                            were(lost), e.what()));
  }
}


}  // namespace lockstep::torch
