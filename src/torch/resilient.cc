// ResilientTrainer; see lockstep/torch/resilient.h. One step:
//   1. for each held shard, ascending: the model's buffers back to the
//      step's start, the gradients made views of the shard's flat buffer,
//      zeroed, the generator seeded from (seed, step, shard), the user's
//      loss and its backward, which accumulates into the flat buffer;
//   2. reduce_shards, bucket by bucket (all in flight at once): every
//      shard's gradients averaged in shard order into the flat reduced
//      buffer, the same bits on every rank;
//   3. the buffers as shard 0's forward left them, broadcast from its
//      holder (a clean run's buffers are rank 0's, whose shard is 0);
//   4. a barrier, the commit point: once any rank has passed it, every
//      rank has reached it, so every rank holds what steps 2 and 3 made;
//   5. commit: gradients from the reduced buffer, optimizer step, buffers,
//      the step count.
// A loss (PeerError; TimeoutError for a rank that stopped answering) in
// 1-4: the group re-forms among the survivors (ProcessGroup::shrink), they
// agree on the highest step any has committed, a survivor one behind
// commits the pending step from what it holds, and the step is redone
// where none had committed it, with the lost ranks' shards shared out.
#include "lockstep/torch/resilient.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/enforce.h"
#include "ddp/logical_shards.h"
#include "lockstep/error.h"
#include "lockstep/reducer.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/sync_batchnorm.h"
#include "lockstep/torch/zero.h"
#include "optimizer_partitions.h"
#include "optimizer_state.h"
#include "state_digest.h"
#include "survival.h"

namespace lockstep::torch {
namespace {

// How long a launcher may take to say a rank ended once its survivors saw
// it go: it reaps the process within its poll (50 ms), starts the
// replacement, and says so in its store (under etcd, in the round's store
// too, over a connection of its own); on a loaded machine hundreds of ms.
constexpr std::chrono::seconds kLauncherSeesADeath{2};

// The most logical shards any member holds (holder[s]: shard s's member).
int most_shards_held(const std::vector<int>& holder) {
  std::map<int, int> held;
  int most = 0;
  for (int member : holder) most = std::max(most, ++held[member]);
  return most;
}

// What a death in place cannot yet survive, named with what to do instead:
// state that lives on one rank only (ZeRO-1's optimizer shards,
// fully_shard's parameter shards) and forwards that call collectives
// (SyncBatchNorm), which a shard computed on another rank cannot repeat.
void refuse_what_cannot_survive(::torch::nn::Module& model, ::torch::optim::Optimizer& optimizer) {
  constexpr const char* kFallback =
      "; such a job restarts from its last checkpoint when a rank dies (lockstep run --on-rank-failure restart "
      "--max-restarts N, docs/faults.md)";
  if (dynamic_cast<ZeroRedundancyOptimizer*>(&optimizer) != nullptr)
    throw ConfigError(fmt::format("ResilientTrainer: ZeroRedundancyOptimizer keeps each rank's optimizer state on "
                                  "that rank only, and a death would lose it; use a plain optimizer here, with "
                                  "ResilientOptions::shard_optimizer_state for ZeRO-1 whose state survives a death{}",
                                  kFallback));
  const auto refuse_module = [&](::torch::nn::Module& m) {
    if (dynamic_cast<FullyShardModule*>(&m) != nullptr)
      throw ConfigError(fmt::format("ResilientTrainer: module '{}' is fully sharded, its parameters' shards each on "
                                    "one rank; train it with ShardedResilientTrainer and a ShardBackup "
                                    "(lockstep/torch/resilient_fsdp.h), which keep each shard on two ranks, or "
                                    "the unsharded model here{}",
                                    m.name(), kFallback));
    const auto* sync = dynamic_cast<SyncBatchNormImpl*>(&m);
    if (sync != nullptr && sync->options.process_group() != nullptr)
      throw ConfigError(fmt::format("ResilientTrainer: module '{}' is a SyncBatchNorm, whose forward calls "
                                    "collectives, and a shard's forward must compute alone; use BatchNorm here{}",
                                    m.name(), kFallback));
  };
  refuse_module(model);
  for (const auto& m : model.modules(/*include_self=*/false)) refuse_module(*m);
}

std::vector<::torch::Tensor> clones(const std::vector<::torch::Tensor>& tensors) {
  std::vector<::torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

void copy_into(const std::vector<::torch::Tensor>& to, const std::vector<::torch::Tensor>& from) {
  ::torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
}

// A bucket: a range [begin, end) of the flat gradient buffers.
struct FlatRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

// DDP's buckets (plan_buckets, reverse order) as ranges of the flat
// buffers, where the parameters lie in model order: a bucket holds
// consecutive parameters, since they share one dtype.
std::vector<FlatRange> flat_buckets(const std::vector<::torch::Tensor>& params, std::size_t cap_bytes) {
  std::vector<ParamSpec> specs;
  std::vector<std::int64_t> offsets;
  std::int64_t at = 0;
  for (const auto& p : params) {
    specs.push_back({.name = "", .count = static_cast<std::size_t>(p.numel())});
    offsets.push_back(at);
    at += p.numel();
  }
  BucketPlanOptions plan;
  plan.bucket_cap_bytes = std::max<std::size_t>(cap_bytes, 1);
  plan.first_bucket_bytes = std::min(plan.first_bucket_bytes, plan.bucket_cap_bytes);
  std::vector<FlatRange> out;
  for (const Bucket& b : plan_buckets(specs, reverse_order(params.size()), plan)) {
    const auto [lo, hi] = std::minmax_element(b.params.begin(), b.params.end());
    const FlatRange r{offsets[*lo], offsets[*hi] + params[*hi].numel()};
    LOCKSTEP_ENFORCE(static_cast<std::size_t>(r.end - r.begin) == b.count,
                     "ResilientTrainer: a bucket's parameters are not consecutive");
    out.push_back(r);
  }
  return out;
}

}  // namespace

struct ResilientTrainer::State {
  std::shared_ptr<::torch::nn::Module> model;
  ::torch::optim::Optimizer* optimizer = nullptr;
  std::shared_ptr<ProcessGroup> world;  // the group given: kept, so the user's copy stays valid
  std::shared_ptr<ProcessGroup> group;  // the one in use
  // Groups a grow replaced, oldest first, kept until the trainer ends: a
  // group that ends cleanly waits for every member's goodbye, and a member
  // that joined by it still holds it (init_process_group gave it), so
  // releasing it at the grow would stall this rank until that member left.
  // Released, with the one in use, newest first on every rank, so that no
  // two ranks wait for each other's goodbyes on two groups. A shrink's old
  // group ended with a loss: it leaves without waiting, and is dropped.
  std::vector<std::shared_ptr<ProcessGroup>> superseded;
  ResilientOptions options;
  int shards = 0;
  int world_size = 0;
  int generation = 0;
  std::vector<int> holder;  // shard -> rank of `group`
  std::vector<::torch::Tensor> params;
  std::vector<::torch::Tensor> buffers;
  std::int64_t flat_count = 0;
  std::vector<FlatRange> buckets;
  ::torch::ScalarType dtype = ::torch::kFloat32;
  std::uint64_t committed = 0;
  // What steps 2 and 3 made for step `committed`, kept until it commits:
  // the reduced gradients and the buffers to commit.
  bool pending = false;
  ::torch::Tensor reduced;
  // Each held shard's gradients, flat, kept from step to step.
  std::map<int, ::torch::Tensor> shard_gradients;
  std::vector<::torch::Tensor> pending_buffers;
  // ZeRO-1 (options.shard_optimizer_state); null otherwise.
  std::unique_ptr<OptimizerPartitions> partitions;

  // False on a replacement until its peers fed it the training state.
  bool has_state = true;
  // Set at the commit point when rank 0 saw a replacement waiting: the
  // group grows once the step has committed.
  bool admit_pending = false;
  survival::ReplacementLook replacement_look;
  // Set by every re-form: before the next step (or the redo), the members
  // look for a replacement on its way (replacement_arrives).
  bool look_for_replacements = false;
  // The last step that committed without a loss: how long it took, and the
  // most shards a rank held in it.
  double step_seconds = 0;
  int most_held_when_timed = 0;
  // A member's digest of the training state it held (with the steps
  // committed then), taken as a replacement was admitted (admit): feed
  // compares it while no step has committed since.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> digest_before_feed;

  std::vector<int> held() const { return shards_held(holder, group->rank()); }
  void observe(std::string_view phase) const {
    if (options.observer) options.observer(phase, committed);
  }
  void reassign() { holder = assign_shards(shards, world_size, group->world_ranks()); }
  std::vector<double> run(const std::function<::torch::Tensor(const Shard&)>& loss_of,
                          const std::vector<::torch::Tensor>& start_buffers);
  void commit();
  std::vector<int> recover(const std::exception_ptr& failure);
  std::int64_t replacements_seen();
  bool replacement_arrives();
  void admit(StepOutcome& outcome);
  void recover_during_admission(const std::exception_ptr& failure, StepOutcome& outcome);
  void settle();
  void feed(int source, const std::vector<int>& receivers);
  const std::vector<std::size_t>* parameters_with_state_fed() const;
  std::uint64_t held_digest();
  void share_parameters();
  template <typename Body>
  void surviving(Body body);
};

ResilientTrainer::ResilientTrainer(std::shared_ptr<::torch::nn::Module> model, ::torch::optim::Optimizer& optimizer,
                                   std::shared_ptr<ProcessGroup> group, ResilientOptions options)
    : state_(std::make_unique<State>()) {
  LOCKSTEP_CHECK_ARG(model != nullptr && group != nullptr, "ResilientTrainer: a model and a group are needed");
  LOCKSTEP_CHECK_ARG(options.shards >= 0, "ResilientTrainer: shards must be 0 (the group's size) or more, not {}",
                     options.shards);
  refuse_what_cannot_survive(*model, optimizer);
  State& s = *state_;
  s.model = std::move(model);
  s.optimizer = &optimizer;
  s.world = group;
  s.group = std::move(group);
  s.options = options;
  s.world_size = s.group->size();
  s.committed = options.first_step;
  s.shards = options.shards > 0 ? options.shards : s.world_size;
  for (auto& p : s.model->parameters())
    if (p.requires_grad()) s.params.push_back(p);
  LOCKSTEP_CHECK_ARG(!s.params.empty(), "ResilientTrainer: the model has no parameter that requires a gradient");
  s.dtype = s.params.front().scalar_type();
  for (const auto& p : s.params) {
    LOCKSTEP_CHECK_ARG(p.scalar_type() == s.dtype && p.device().is_cpu(),
                       "ResilientTrainer: every parameter must be a CPU tensor of one floating type ({} and {} "
                       "found); convert the model first",
                       ::c10::toString(s.dtype), ::c10::toString(p.scalar_type()));
    s.flat_count += p.numel();
  }
  s.buffers = s.model->buffers();
  s.reduced = ::torch::zeros({s.flat_count}, ::torch::TensorOptions().dtype(s.dtype));
  s.buckets = flat_buckets(s.params, options.bucket_cap_bytes);
  if (s.group->joined()) {
    // A replacement: the step count, the shards, the parameters, buffers
    // and optimizer state come from its peers, whatever the options said.
    s.has_state = false;
    try {
      s.settle();
    } catch (const PeerError&) {
      s.recover(std::current_exception());  // settles again, with whoever is left
    } catch (const TimeoutError&) {
      s.recover(std::current_exception());
    }
    s.observe("joined");
    return;
  }
  s.reassign();
  // Every rank starts from rank 0's parameters and buffers, as DDP does.
  std::vector<::torch::Tensor> start = s.params;
  start.insert(start.end(), s.buffers.begin(), s.buffers.end());
  broadcast_coalesced(*s.group, start, 0);
  if (options.shard_optimizer_state) {
    s.partitions = std::make_unique<OptimizerPartitions>(optimizer, s.shards, options.optimizer_state_backup,
                                                         /*keeps_state=*/true);
    s.partitions->place(*s.group, s.holder);
  }
}

ResilientTrainer::~ResilientTrainer() {
  // The job's work is done (or failed here): a replacement waiting, or
  // started from now on, is told so instead of waiting for a step boundary.
  try {
    if (state_->group->rank() == 0) state_->group->close_to_replacements();
  } catch (const std::exception&) {
    // The store is gone: a replacement waiting times out instead.
  }
  // Newest first (State::superseded says why); the group given last.
  state_->group.reset();
  while (!state_->superseded.empty()) state_->superseded.pop_back();
}

std::uint64_t ResilientTrainer::steps_committed() const { return state_->committed; }
std::vector<int> ResilientTrainer::shards() const { return state_->held(); }
ProcessGroup& ResilientTrainer::group() const { return *state_->group; }
int ResilientTrainer::generation() const { return state_->generation; }
std::size_t ResilientTrainer::bucket_count() const { return state_->buckets.size(); }
int ResilientTrainer::shard_count() const { return state_->shards; }
std::size_t ResilientTrainer::optimizer_state_bytes() const {
  return state_->partitions ? state_->partitions->kept_state_bytes() : state_bytes(*state_->optimizer);
}

// Runs `body` (collective) until it completes on a group that stands: a
// loss meanwhile re-forms the group first (nothing is pending: no step is
// redone).
template <typename Body>
void ResilientTrainer::State::surviving(Body body) {
  for (;;) {
    std::exception_ptr failure;
    try {
      body();
      return;
    } catch (const PeerError&) {
      failure = std::current_exception();
    } catch (const TimeoutError&) {
      failure = std::current_exception();
    }
    recover(failure);
  }
}

void ResilientTrainer::consolidate_optimizer_state() {
  State& s = *state_;
  if (s.partitions) s.surviving([&] { s.partitions->consolidate(*s.group, 0); });
}

StepOutcome ResilientTrainer::step(const std::function<::torch::Tensor(const Shard&)>& loss_of) {
  State& s = *state_;
  StepOutcome outcome;
  outcome.step = s.committed;
  const std::vector<::torch::Tensor> start_buffers = clones(s.buffers);
  const std::uint64_t target = s.committed + 1;
  for (;;) {
    std::exception_ptr failure;
    try {
      if (s.look_for_replacements && s.replacement_arrives()) s.admit(outcome);
      if (s.committed < target) {
        const auto started = std::chrono::steady_clock::now();
        const int most_held = most_shards_held(s.holder);
        outcome.losses = s.run(loss_of, start_buffers);
        s.commit();
        if (outcome.lost.empty()) {
          s.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
          s.most_held_when_timed = most_held;
        }
      }
      s.share_parameters();
      if (s.admit_pending) s.admit(outcome);
      return outcome;
    } catch (const PeerError&) {
      failure = std::current_exception();  // only valid inside the handler
    } catch (const TimeoutError&) {
      failure = std::current_exception();  // a rank that stopped answering
    }
    const auto seen = std::chrono::steady_clock::now();
    std::vector<int> lost = s.recover(failure);
    outcome.recovery_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count();
    outcome.lost.insert(outcome.lost.end(), lost.begin(), lost.end());
    // Committed here, or by another rank and so by this one now; the
    // re-formed group placed the parameters.
    if (s.committed == target) return outcome;
    copy_into(s.buffers, start_buffers);
    ++outcome.redone;
  }
}

std::vector<double> ResilientTrainer::State::run(const std::function<::torch::Tensor(const Shard&)>& loss_of,
                                                 const std::vector<::torch::Tensor>& start_buffers) {
  const std::vector<int> mine = held();
  std::vector<::torch::Tensor> flats;
  std::vector<double> losses;
  std::vector<::torch::Tensor> after_shard_0;
  for (int shard : mine) {
    observe("shard");
    copy_into(buffers, start_buffers);
    // The gradients are views of the shard's flat buffer, zeroed, which
    // backward accumulates into in place (as DDP's gradient_as_bucket_view):
    // nothing to allocate or copy. A parameter this shard did not use keeps
    // its zeros.
    ::torch::Tensor& flat = shard_gradients[shard];
    if (!flat.defined()) flat = ::torch::empty({flat_count}, ::torch::TensorOptions().dtype(dtype));
    flat.zero_();
    std::vector<::torch::Tensor> views;
    std::int64_t at = 0;
    for (auto& p : params) {
      views.push_back(flat.slice(0, at, at + p.numel()).view_as(p));
      p.mutable_grad() = views.back();
      at += p.numel();
    }
    ::torch::manual_seed(survival::shard_seed(options.seed, committed, shard));
    ::torch::Tensor loss = loss_of(Shard{shard, shards, committed});
    loss.backward();
    losses.push_back(loss.item<double>());
    ::torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!params[i].grad().is_same(views[i])) {
        // The user's function replaced a gradient (or dropped it): take its value.
        if (params[i].grad().defined())
          views[i].copy_(params[i].grad());
        else
          views[i].zero_();
      }
    flats.push_back(flat);
    if (shard == 0) after_shard_0 = clones(buffers);
  }
  pending = false;
  std::vector<std::shared_ptr<Work>> in_flight;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    observe(b == 0 ? std::string("reduce") : fmt::format("bucket{}", b));
    const FlatRange& r = buckets[b];
    std::vector<ConstBuffer> inputs;
    for (const auto& f : flats) inputs.push_back(buffer_of(f.slice(0, r.begin, r.end), "a shard's gradients"));
    in_flight.push_back(group->reduce_shards(inputs, holder, buffer_of(reduced.slice(0, r.begin, r.end), "the reduced gradients"),
                                             ReduceOp::avg));
  }
  // Every bucket's end is waited for, even after one failed: none may write
  // into the buffers while the step is redone.
  wait_all(in_flight);
  // The buffers shard 0's forward left, from its holder.
  pending_buffers = after_shard_0.empty() ? clones(start_buffers) : after_shard_0;
  observe("buffers");
  broadcast_coalesced(*group, pending_buffers, holder[0]);
  pending = true;
  observe("barrier");
  // The commit point: an allreduce, a barrier that also carries whether
  // rank 0 saw a replacement waiting, so that every rank grows the group
  // after the same step.
  std::int64_t waiting = group->rank() == 0 ? replacements_seen() : 0;
  group->allreduce(Buffer{&waiting, 1, DType::i64}, ReduceOp::max)->wait();
  admit_pending = waiting > 0;
  return losses;
}

void ResilientTrainer::State::commit() {
  LOCKSTEP_ENFORCE(pending, "ResilientTrainer: commit without a reduced step");
  observe("commit");
  ::torch::NoGradGuard no_grad;
  std::int64_t at = 0;
  // Views of the reduced buffer, as DDP's gradient_as_bucket_view: valid
  // until the next step's reduction writes it.
  for (auto& p : params) {
    p.mutable_grad() = reduced.slice(0, at, at + p.numel()).view_as(p);
    at += p.numel();
  }
  if (partitions)
    partitions->step();  // the partitions this rank keeps; share_parameters() sends the owners'
  else
    optimizer->step();
  copy_into(buffers, pending_buffers);
  pending = false;
  ++committed;
  observe("committed");
}

// Re-forms the group until it stands (each attempt may lose another rank),
// agrees on the committed step, and shares the shards out anew. Returns the
// world ranks lost.
std::vector<int> ResilientTrainer::State::recover(const std::exception_ptr& failure) {
  const std::vector<int> before = group->world_ranks();
  std::vector<int> lost_here = survival::named_lost(failure, *group);
  observe("re-form");
  for (int attempt = 0;; ++attempt) {
    try {
      std::shared_ptr<ProcessGroup> next = group->shrink(lost_here, options.window);
      group = std::move(next);
      ++generation;
      settle();
      observe("re-formed");
      break;
    } catch (const PeerError&) {
      // Another rank lost while re-forming (or the new group could not be
      // connected): again, on the group in use.
      if (attempt >= 16) throw;
      lost_here = survival::named_lost(std::current_exception(), *group);
    } catch (const TimeoutError&) {
      if (attempt >= 16) throw;
      lost_here.clear();
    }
  }
  look_for_replacements = true;
  const std::vector<int>& after = group->world_ranks();
  std::vector<int> lost;
  for (int w : before)
    if (std::find(after.begin(), after.end(), w) == after.end()) lost.push_back(w);
  return lost;
}

// Rank 0's count of replacements waiting (survival::ReplacementLook).
std::int64_t ResilientTrainer::State::replacements_seen() {
  const auto waiting = replacement_look.waiting(*group);
  return waiting ? static_cast<std::int64_t>(waiting->size()) : 0;
}

// After a re-form, before the step is redone (or the next one runs): a
// replacement already started (a local rank the launcher started again)
// is worth waiting for while it costs less than the step without it. A
// rank that holds more shards now makes the step last longer by the ratio
// of the shards held; the replacement admitted at once would be fed and
// take its shard back, so waiting pays while it is shorter than that extra
// time (the last clean step's, scaled). The survivors see a death before
// its launcher may have: a lost rank whose end the launcher has not yet
// said may be replaced in a moment, and is waited for as one on its way,
// for kLauncherSeesADeath at most (a launcher that died with its node
// never says). Rank 0 looks and waits; the members agree on its answer.
// Collective.
bool ResilientTrainer::State::replacement_arrives() {
  look_for_replacements = false;
  std::int64_t arrived = 0;
  if (group->rank() == 0 && most_held_when_timed > 0) {
    const double slower = static_cast<double>(most_shards_held(holder)) / most_held_when_timed - 1;
    const auto worth = std::min(std::chrono::duration<double>(step_seconds * slower),
                                std::chrono::duration<double>(options.window) / 2);
    const auto looked = std::chrono::steady_clock::now();
    const auto deadline = looked + worth;
    const auto unseen_deadline =
        looked + std::min(std::chrono::duration<double>(worth), std::chrono::duration<double>(kLauncherSeesADeath));
    const auto on_its_way = [&] {
      const auto now = std::chrono::steady_clock::now();
      return now < deadline && (!group->replacements_started().empty() ||
                                (now < unseen_deadline && !group->ends_unseen_by_launcher().empty()));
    };
    try {
      // Until it asks, ends (its launcher marks it), or the wait stops paying.
      while (worth.count() > 0 && on_its_way()) {
        if (!group->replacements_waiting().empty()) {
          arrived = 1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const Error&) {
      arrived = 0;  // the store does not answer now: the next commit point looks again
    }
  }
  group->allreduce(Buffer{&arrived, 1, DType::i64}, ReduceOp::max)->wait();
  return arrived > 0;
}

// A loss while replacements were admitted: recovered from as in a step
// (the step has committed: nothing is redone).
void ResilientTrainer::State::recover_during_admission(const std::exception_ptr& failure, StepOutcome& outcome) {
  const auto seen = std::chrono::steady_clock::now();
  const std::vector<int> gone = recover(failure);
  outcome.recovery_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count();
  outcome.lost.insert(outcome.lost.end(), gone.begin(), gone.end());
}

// After a committed step that saw a replacement waiting (or a re-form that
// waited for one): the group grows (ProcessGroup::grow), the members agree
// on the old group that it stands, and the replacements are fed (settle).
// A replacement that did not come leaves the old group in use; a member
// lost meanwhile is recovered from as in a step. The world ranks that
// joined go into `outcome.joined`.
void ResilientTrainer::State::admit(StepOutcome& outcome) {
  admit_pending = false;
  observe("admit");
  const std::vector<int> waiting = group->rank() == 0 ? group->replacements_waiting() : std::vector<int>{};
  std::shared_ptr<ProcessGroup> grown;
  try {
    grown = group->grow(waiting, options.window);
  } catch (const Error&) {
    // Not formed here (grow says why in the log of the rank that knows):
    // decided below, with the others.
  }
  const auto recover_here = [&](const std::exception_ptr& failure) { recover_during_admission(failure, outcome); };
  std::int64_t formed = grown ? 1 : 0;
  if (!survival::survived([&] { group->allreduce(Buffer{&formed, 1, DType::i64}, ReduceOp::min)->wait(); },
                          recover_here))
    return;
  if (formed == 0) return;  // its launcher starts another once the process ends
  // The replacements build their models before they can be fed: a member
  // waits for them in settle's first collective. It digests what it
  // holds meanwhile (the feed changes none of it), on cores the feed's
  // copies would need once it starts.
  if (has_state) digest_before_feed.emplace(committed, held_digest());
  const std::vector<int> before = group->world_ranks();
  superseded.push_back(std::move(group));
  group = std::move(grown);
  ++generation;
  survival::survived([&] { settle(); }, recover_here);
  for (int w : group->world_ranks())
    if (std::find(before.begin(), before.end(), w) == before.end()) outcome.joined.push_back(w);
  observe("admitted");
}

// On a group just formed (shrunk or grown): the members agree on the
// highest step any committed (a survivor one behind commits the pending
// step from what it holds: a survivor committed only after passing the
// commit point, which every rank had reached), and the members without
// the training state (replacements) get it from the first member with it.
void ResilientTrainer::State::settle() {
  const auto size = static_cast<std::size_t>(group->size());
  std::vector<std::int64_t> committed_of(size);
  const std::int64_t mine = has_state ? static_cast<std::int64_t>(committed) : -1;
  group->allgather(ConstBuffer{&mine, 1, DType::i64}, Buffer{committed_of.data(), size, DType::i64})->wait();
  const std::int64_t highest = *std::max_element(committed_of.begin(), committed_of.end());
  if (highest < 0)
    throw Error(fmt::format("ResilientTrainer: no rank of the group (world ranks {}) holds the training state: every "
                            "rank that did was lost before the replacements were fed; the job restarts from its last "
                            "checkpoint (lockstep run --max-restarts)",
                            fmt::join(group->world_ranks(), ",")));
  if (has_state) {
    if (static_cast<std::uint64_t>(highest) == committed + 1) {
      if (!pending)
        throw Error(fmt::format("ResilientTrainer: a survivor committed step {} but this rank holds no reduced "
                                "gradients for it; the commit rule was broken",
                                committed));
      commit();
    } else if (static_cast<std::uint64_t>(highest) != committed) {
      throw Error(fmt::format("ResilientTrainer: survivors are {} steps apart; at most one is possible",
                              highest - static_cast<std::int64_t>(committed)));
    }
  }
  const auto source = std::find_if(committed_of.begin(), committed_of.end(), [](std::int64_t c) { return c >= 0; });
  std::vector<int> lacking;  // the replacements
  for (std::size_t r = 0; r < size; ++r)
    if (committed_of[r] < 0) lacking.push_back(static_cast<int>(r));
  if (!lacking.empty()) feed(static_cast<int>(source - committed_of.begin()), lacking);
  reassign();
  if (options.shard_optimizer_state) {
    // Only a replacement has none yet: it keeps no state until placed.
    if (!partitions)
      partitions = std::make_unique<OptimizerPartitions>(*optimizer, shards, options.optimizer_state_backup,
                                                         /*keeps_state=*/false);
    partitions->place(*group, holder);
  }
}

// With the optimizer state sharded: each partition's parameters from its
// owner, once a step committed.
void ResilientTrainer::State::share_parameters() {
  if (partitions) partitions->share_parameters(*group);
}

// The parameters whose optimizer state a feed sends and compares: all
// (null), or none where it is sharded (it is placed by partition; the
// optimizer's options still go).
const std::vector<std::size_t>* ResilientTrainer::State::parameters_with_state_fed() const {
  static const std::vector<std::size_t> none;  // immutable: shared safely
  return options.shard_optimizer_state ? &none : nullptr;
}

// What a feed compares: the optimizer's state and options, the parameters
// and buffers.
std::uint64_t ResilientTrainer::State::held_digest() {
  std::uint64_t digest = digest_of(*optimizer, kDigestStart, parameters_with_state_fed());
  digest = digest_of(params, digest);
  return digest_of(buffers, digest);
}

// The training state from rank `source` to the members in `receivers`
// (those without it: replacements): the step count, the shards and the
// world's size at start (to every member), the parameters and buffers,
// the optimizer's state and options (broadcast_optimizer_state), by sends
// from `source` to them alone; the other members hold the same bytes and
// neither copy nor take the cores the copies need. Then every member
// compares a digest of what it holds: a replacement holds exactly its
// peers' bytes, or the job stops here, naming who differs.
void ResilientTrainer::State::feed(int source, const std::vector<int>& receivers) {
  observe("feed");
  std::int64_t header[3] = {static_cast<std::int64_t>(committed), shards, world_size};
  group->broadcast(Buffer{header, 3, DType::i64}, source)->wait();
  std::vector<::torch::Tensor> tensors = params;
  tensors.insert(tensors.end(), buffers.begin(), buffers.end());
  send_coalesced(*group, tensors, source, receivers);
  broadcast_optimizer_state(*group, *optimizer, source, parameters_with_state_fed(), &receivers);
  if (!has_state) {
    committed = static_cast<std::uint64_t>(header[0]);
    shards = static_cast<int>(header[1]);
    world_size = static_cast<int>(header[2]);
    has_state = true;
  }
  // What this rank holds now, digested before the feed where it held it
  // then.
  const bool digested = digest_before_feed && digest_before_feed->first == committed;
  std::uint64_t digest = digested ? digest_before_feed->second : held_digest();
  digest_before_feed.reset();
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(group->size()));
  static_assert(sizeof(std::uint64_t) == sizeof(std::int64_t));
  group->allgather(ConstBuffer{&digest, 1, DType::i64}, Buffer{digests.data(), digests.size(), DType::i64})->wait();
  std::vector<int> differ;
  for (std::size_t r = 0; r < digests.size(); ++r)
    if (digests[r] != digests[static_cast<std::size_t>(source)]) differ.push_back(group->world_ranks()[r]);
  if (!differ.empty())
    throw Error(fmt::format("ResilientTrainer: after the training state was sent from world rank {}, world rank(s) "
                            "{} hold other bytes (parameters, buffers or optimizer state); replicas that differ would "
                            "train apart silently, so the job stops here",
                            group->world_ranks()[static_cast<std::size_t>(source)], fmt::join(differ, ",")));
  observe("fed");
}

}  // namespace lockstep::torch
