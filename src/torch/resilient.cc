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
#include <set>

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

namespace lockstep::torch {
namespace {

// A generator seed of its own for each (seed, step, shard).
std::uint64_t mix(std::uint64_t seed, std::uint64_t step, int shard) {
  std::uint64_t x = seed ^ (step * 0x9e3779b97f4a7c15ull) ^ (static_cast<std::uint64_t>(shard + 1) << 32);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (x ^ (x >> 31)) & 0x7fffffffffffffffull;
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
                                  "that rank only, and a death would lose it; use a plain optimizer here{}",
                                  kFallback));
  const auto refuse_module = [&](::torch::nn::Module& m) {
    if (dynamic_cast<FullyShardModule*>(&m) != nullptr)
      throw ConfigError(fmt::format("ResilientTrainer: module '{}' is fully sharded, its parameters' shards each on "
                                    "one rank, and a death would lose them; train the unsharded model here{}",
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

  std::vector<int> held() const { return shards_held(holder, group->rank()); }
  void observe(std::string_view phase) const {
    if (options.observer) options.observer(phase, committed);
  }
  void reassign() { holder = assign_shards(shards, world_size, group->world_ranks()); }
  std::vector<double> run(const std::function<::torch::Tensor(const Shard&)>& loss_of,
                          const std::vector<::torch::Tensor>& start_buffers);
  void commit();
  std::vector<int> recover(const std::exception_ptr& failure);
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
  s.reassign();
  // Every rank starts from rank 0's parameters and buffers, as DDP does.
  std::vector<::torch::Tensor> start = s.params;
  start.insert(start.end(), s.buffers.begin(), s.buffers.end());
  broadcast_coalesced(*s.group, start, 0);
}

ResilientTrainer::~ResilientTrainer() = default;

std::uint64_t ResilientTrainer::steps_committed() const { return state_->committed; }
std::vector<int> ResilientTrainer::shards() const { return state_->held(); }
ProcessGroup& ResilientTrainer::group() const { return *state_->group; }
int ResilientTrainer::generation() const { return state_->generation; }
std::size_t ResilientTrainer::bucket_count() const { return state_->buckets.size(); }

StepOutcome ResilientTrainer::step(const std::function<::torch::Tensor(const Shard&)>& loss_of) {
  State& s = *state_;
  StepOutcome outcome;
  outcome.step = s.committed;
  const std::vector<::torch::Tensor> start_buffers = clones(s.buffers);
  for (;;) {
    std::exception_ptr failure;
    try {
      outcome.losses = s.run(loss_of, start_buffers);
      s.commit();
      return outcome;
    } catch (const PeerError&) {
      failure = std::current_exception();  // only valid inside the handler
    } catch (const TimeoutError&) {
      failure = std::current_exception();  // a rank that stopped answering
    }
    const std::uint64_t before = s.committed;
    const auto seen = std::chrono::steady_clock::now();
    std::vector<int> lost = s.recover(failure);
    outcome.recovery_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count();
    outcome.lost.insert(outcome.lost.end(), lost.begin(), lost.end());
    if (s.committed > before) return outcome;  // another rank had committed it; so has this one now
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
    ::torch::manual_seed(mix(options.seed, committed, shard));
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
  std::exception_ptr failed;
  for (const auto& work : in_flight) {
    try {
      work->wait();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  // The buffers shard 0's forward left, from its holder.
  pending_buffers = after_shard_0.empty() ? clones(start_buffers) : after_shard_0;
  observe("buffers");
  broadcast_coalesced(*group, pending_buffers, holder[0]);
  pending = true;
  observe("barrier");
  group->barrier()->wait();
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
  optimizer->step();
  copy_into(buffers, pending_buffers);
  pending = false;
  ++committed;
  observe("committed");
}

namespace {

// The rank of `group` a failure names as lost (a PeerError's peer), if any.
// A PeerError naming this rank itself means it was left out: it must stop.
std::vector<int> named_lost(const std::exception_ptr& failure, const ProcessGroup& group) {
  try {
    std::rethrow_exception(failure);
  } catch (const PeerError& e) {
    if (e.peer() == group.rank()) throw;
    if (e.peer() >= 0 && e.peer() < group.size()) return {e.peer()};
  } catch (const TimeoutError&) {
  }
  return {};
}

}  // namespace

// Re-forms the group until it stands (each attempt may lose another rank),
// agrees on the committed step, and shares the shards out anew. Returns the
// world ranks lost.
std::vector<int> ResilientTrainer::State::recover(const std::exception_ptr& failure) {
  const std::vector<int> before = group->world_ranks();
  std::vector<int> lost_here = named_lost(failure, *group);
  observe("re-form");
  for (int attempt = 0;; ++attempt) {
    try {
      std::shared_ptr<ProcessGroup> next = group->shrink(lost_here, options.window);
      group = std::move(next);
      ++generation;
      // The highest step any survivor committed. A rank one behind has what
      // that step needs: a survivor committed only after passing the commit
      // point's barrier, which every rank had reached.
      std::int64_t highest = static_cast<std::int64_t>(committed);
      group->allreduce(Buffer{&highest, 1, DType::i64}, ReduceOp::max)->wait();
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
      reassign();
      observe("re-formed");
      break;
    } catch (const PeerError&) {
      // Another rank lost while re-forming (or the new group could not be
      // connected): again, on the group in use.
      if (attempt >= 16) throw;
      lost_here = named_lost(std::current_exception(), *group);
    } catch (const TimeoutError&) {
      if (attempt >= 16) throw;
      lost_here.clear();
    }
  }
  const std::vector<int>& after = group->world_ranks();
  std::vector<int> lost;
  for (int w : before)
    if (std::find(after.begin(), after.end(), w) == after.end()) lost.push_back(w);
  return lost;
}

}  // namespace lockstep::torch
