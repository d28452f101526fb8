#include "fsdp_unit.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/distributed.h"

namespace lockstep::torch::detail {
namespace {

namespace autograd = ::torch::autograd;
using ::torch::Tensor;

// Frees a tensor's memory but keeps its storage object, which views of it
// (those autograd saved) share; allocate() gives it memory again.
void release(const Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}
void allocate(const Tensor& t, std::size_t bytes) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == bytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

// Gives each unit of a model a shard size of its own, so that ranks
// gathering different units fail on the collective's count (the backends
// compare counts before exchanging data) instead of mixing their
// parameters. The number is how many units this rank made on this group
// since the last root (a unit with units inside it): the unit's place in
// its model, the same on every rank and in every run of the program, so a
// sharded checkpoint finds the same layout. Kept in the group's store,
// under a key of this rank's.
std::int64_t unit_ordinal(ProcessGroup& group, bool root) {
  if (group.size() == 1 || !group.store()) return 0;
  const std::string key = fmt::format("fully_shard/units/rank{}", group.rank());
  const std::int64_t ordinal = group.store()->add(key, 1) - 1;
  if (root) group.store()->add(key, -(ordinal + 1));
  return ordinal;
}

::torch::ScalarType common_dtype(const std::string& unit, const std::vector<std::pair<std::string, Tensor>>& params) {
  const ::torch::ScalarType first = params.front().second.scalar_type();
  for (const auto& [name, p] : params) {
    if (p.scalar_type() != first)
      throw InvalidArgument(fmt::format(
          "fully_shard: the parameters of {} are of several dtypes ({} is {}, {} is {}); one unit gathers one "
          "flat buffer: shard the parameters of the other dtype in a unit of their own",
          unit, params.front().first, c10::toString(first), name, c10::toString(p.scalar_type())));
  }
  return first;
}

std::vector<std::int64_t> numels_of(const std::vector<Tensor>& params) {
  std::vector<std::int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  return numels;
}

// Piece `piece` of the reduced shard as a tensor of its own that shares
// the shard's memory, so that a parameter gets its gradient without a copy.
// Not a view of the shard: optimizers' zero_grad detaches gradients in
// place, which a view refuses. The shard's memory lives as long as any
// parameter's gradient in it.
Tensor piece_of(const Tensor& reduced_shard, const ShardPiece& piece) {
  void* data = static_cast<char*>(reduced_shard.data_ptr()) + piece.shard_offset * reduced_shard.element_size();
  return ::torch::from_blob(data, {piece.count}, [keep = reduced_shard.storage()](void*) {},
                            reduced_shard.options());
}

}  // namespace

FsdpUnit::FsdpUnit(std::string name, std::vector<std::pair<std::string, Tensor>> params,
                   std::vector<std::pair<std::string, std::shared_ptr<FsdpUnit>>> nested,
                   std::shared_ptr<ProcessGroup> group, FullyShardOptions options)
    : name_(std::move(name)),
      group_(std::move(group)),
      options_(std::move(options)),
      layout_({}, 1),
      step_(std::make_shared<FsdpStep>()) {
  if (!group_) throw InvalidArgument("fully_shard needs a process group");
  step_->timeline = std::make_unique<FsdpTimeline>(*group_);
  if (options_.prefetch < 0 || options_.reduce_scatters_in_flight < 1)
    throw InvalidArgument("fully_shard: prefetch must be at least 0 and reduce_scatters_in_flight at least 1");
  ::torch::NoGradGuard no_grad;
  // The units inside join this one's step: their names get this unit's
  // path, and this unit, made last, is the root.
  for (auto& [path, unit] : nested) {
    for (FsdpUnit* inner : unit->step_->units) {
      inner->name_ = inner == unit.get() ? path : path + "." + inner->name_;
      step_->units.push_back(inner);
    }
    nested_.push_back(unit);
  }
  for (FsdpUnit* inner : step_->units) inner->step_ = step_;
  step_->units.push_back(this);
  step_->root = this;

  refuse_shared_parameters(params);
  // A replacement joining a running group (ProcessGroup::joined) builds
  // its units alone: its peers are long past theirs, and feed it its
  // shard instead (ShardedResilientTrainer).
  const bool joining = group_->joined();
  if (!joining) verify_same_across_ranks(*group_, params, "parameters of the fully_shard unit " + name_);
  for (auto& [param_name, p] : params) {
    names_.push_back(param_name);
    params_.push_back(p);
    shapes_.push_back(p.sizes().vec());
    if (p.requires_grad()) trained_.push_back(params_.size() - 1);
  }
  dtype_ = params_.empty() ? ::torch::kFloat : common_dtype(name_, params);
  compute_dtype_ = options_.mp_policy.param_dtype.value_or(dtype_);
  reduce_dtype_ = options_.mp_policy.reduce_dtype.value_or(compute_dtype_);
  layout_ = ShardLayout(numels_of(params_), group_->size(), unit_ordinal(*group_, !nested_.empty()));
  for (std::size_t i = 0; i < params_.size(); ++i) pieces_.push_back(layout_.piece_of(group_->rank(), i));

  // The flat buffer of every parameter, rank 0's values when asked; this
  // rank keeps its shard, and the whole ones are freed.
  const auto device = params_.empty() ? ::torch::Device(::torch::kCPU) : params_.front().device();
  Tensor flat = ::torch::zeros({layout_.flat_elements()}, ::torch::dtype(dtype_).device(device));
  for (std::size_t i = 0; i < params_.size(); ++i)
    flat.narrow(0, layout_.flat_offset(i), layout_.numel(i)).copy_(params_[i].reshape(-1));
  if (options_.sync_module_states && group_->size() > 1 && !joining) broadcast(*group_, flat, 0);
  shard_ = flat.narrow(0, layout_.shard_elements() * group_->rank(), layout_.shard_elements()).clone();
  // In a world of one the shard is the whole: nothing to gather or free.
  alone_ = group_->size() == 1 && compute_dtype_ == dtype_;
  if (alone_) {
    full_ = shard_;
  } else {
    full_ = ::torch::empty({layout_.flat_elements()}, ::torch::dtype(compute_dtype_).device(device));
    full_bytes_ = full_.nbytes();
    release(full_);
  }
  use_sharded();
  had_gradient_.assign(params_.size(), false);
  accumulators_.resize(trained_.size());
  hook_keys_.resize(trained_.size());
}

// A parameter in two units (a weight tied across blocks) would be sharded
// twice, the second time from the first's piece of it.
void FsdpUnit::refuse_shared_parameters(const std::vector<std::pair<std::string, Tensor>>& params) const {
  std::map<const c10::TensorImpl*, std::string> owner;
  auto claim = [&](const Tensor& p, const std::string& name) {
    const auto [it, first] = owner.emplace(p.unsafeGetTensorImpl(), name);
    if (!first)
      throw InvalidArgument(fmt::format(
          "fully_shard: parameter {} is also {}: a parameter can belong to one unit only; shard the modules that "
          "share it together, in their common parent's unit",
          name, it->second));
  };
  for (const FsdpUnit* unit : step_->units)
    if (unit != this)
      for (std::size_t i = 0; i < unit->params_.size(); ++i) claim(unit->params_[i], unit->name_ + "." + unit->names_[i]);
  for (const auto& [name, p] : params) claim(p, name_ + "." + name);
}

FsdpUnit::~FsdpUnit() {
  for (std::size_t k = 0; k < accumulators_.size(); ++k)
    if (accumulators_[k]) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

std::vector<FsdpUnit*> FsdpUnit::units_within() {
  std::vector<FsdpUnit*> out;
  for (const auto& unit : nested_) {
    auto inner = unit->units_within();
    out.insert(out.end(), inner.begin(), inner.end());
  }
  out.push_back(this);
  return out;
}

Tensor FsdpUnit::cast_forward_input(const Tensor& t) const {
  const auto& policy = options_.mp_policy;
  if (!policy.param_dtype || !policy.cast_forward_inputs || !t.defined() || !t.is_floating_point()) return t;
  return t.scalar_type() == *policy.param_dtype ? t : t.to(*policy.param_dtype);
}

void FsdpUnit::wait_named(Work& work, const char* what) {
  try {
    work.wait();
    if (step_->timeline->on()) step_->timeline->collective(fmt::format("{} {}", what, name_), work);
  } catch (const MismatchError& e) {
    std::string counts;
    for (const FsdpUnit* unit : step_->units)
      counts += fmt::format("\n  {}: {} elements per rank", unit->name_, unit->layout_.shard_elements());
    throw MismatchError(fmt::format(
        "fully_shard: the {} of unit {} met another operation on a peer: {}\nEach unit's collectives have a "
        "count of their own:{}\nA rank that skipped a unit's forward, or ran the units in another order, "
        "issues another unit's count: every rank must run the same units in the same order",
        what, name_, e.what(), counts));
  }
}

// ---- gathering and resharding -------------------------------------------

void FsdpUnit::start_gather() {
  if (state_ != State::sharded) return;
  if (alone_) {
    state_ = State::gathering;
    return;
  }
  allocate_full();
  gather_input_ = compute_dtype_ == dtype_ ? shard_ : shard_.to(compute_dtype_);
  gather_work_ = all_gather_into_tensor(*group_, full_, gather_input_, /*async_op=*/true);
  state_ = State::gathering;
}

void FsdpUnit::allocate_full() { allocate(full_, full_bytes_); }

void FsdpUnit::finish_gather() {
  if (state_ != State::gathering) return;
  if (auto work = std::move(gather_work_)) wait_named(*work, "all-gather");
  gather_input_ = Tensor();
  state_ = State::unsharded;
  use_unsharded();
}

void FsdpUnit::gather_now() {
  start_gather();
  finish_gather();
}

void FsdpUnit::use_unsharded() {
  stash_gradients();
  for (std::size_t i = 0; i < params_.size(); ++i)
    params_[i].set_data(full_.narrow(0, layout_.flat_offset(i), layout_.numel(i)).view(shapes_[i]));
}

void FsdpUnit::use_sharded() {
  if (state_ == State::gathering) finish_gather();
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].set_data(shard_.narrow(0, pieces_[i].shard_offset, pieces_[i].count));
  if (!alone_) release(full_);
  state_ = State::sharded;
}

// The gradients the shards had before this step are set aside while
// backward fills the parameters' whole gradients, and added back after.
void FsdpUnit::stash_gradients() {
  if (stashed_) return;
  stash_.assign(params_.size(), Tensor());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    stash_[i] = params_[i].grad();
    if (stash_[i].defined()) params_[i].mutable_grad() = Tensor();
  }
  stashed_ = true;
}

// The hook that counts the unit's gradients sits on each parameter's
// gradient accumulator, which autograd makes anew when a parameter's dtype
// changes (mixed precision): take it each time forward gathers.
void FsdpUnit::hook_accumulators() {
  for (std::size_t k = 0; k < trained_.size(); ++k) {
    auto accumulator = autograd::impl::grad_accumulator(params_[trained_[k]]);
    if (accumulator == accumulators_[k]) continue;
    if (accumulators_[k]) accumulators_[k]->del_post_hook(hook_keys_[k]);
    hook_keys_[k] = accumulator->add_post_hook(std::make_unique<autograd::utils::LambdaPostHook>(
        [this](const autograd::variable_list& outputs, const autograd::variable_list&) {
          on_gradient();
          return outputs;
        }));
    accumulators_[k] = std::move(accumulator);
  }
}

void FsdpUnit::start_prefetch(const std::vector<FsdpUnit*>& order) {
  if (!step_->order_known || options_.prefetch == 0) return;
  const auto at = std::find(order.begin(), order.end(), this);
  if (at == order.end()) return;
  for (auto next = at + 1; next != order.end() && next - at <= options_.prefetch; ++next) (*next)->start_gather();
}

// ---- forward --------------------------------------------------------------

void FsdpUnit::before_forward() {
  const bool training = ::torch::GradMode::is_enabled();
  auto& step = *step_;
  if (is_root()) {
    if (step.in_step && !step.backward_queued) finish_step();  // the last forward's backward never ran
    step.in_step = training;
    if (training && !step.order_known) step.forward_order.clear(), step.backward_order.clear();
  }
  const bool recording = training && !step.order_known;
  if (recording && std::find(step.forward_order.begin(), step.forward_order.end(), this) == step.forward_order.end())
    step.forward_order.push_back(this);
  FsdpTimeline* timeline = training && step.timeline->on() ? step.timeline.get() : nullptr;
  if (timeline) timeline->forward_entered(this);
  gather_now();
  if (!training) return;
  if (timeline) timeline->forward_gathered(this);
  hook_accumulators();
  start_prefetch(step.forward_order);
}

void FsdpUnit::after_forward(const std::vector<Tensor>& outputs) {
  const bool training = ::torch::GradMode::is_enabled();
  auto& step = *step_;
  if (training && step.timeline->on()) step.timeline->forward_left(this);
  bool hooked = false;
  if (training) {
    for (const auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t.register_hook([this](const Tensor&) { pre_backward(); });
      hooked = true;
    }
    if (!step.order_known &&
        std::find(step.backward_order.begin(), step.backward_order.end(), this) == step.backward_order.end())
      step.backward_order.insert(step.backward_order.begin(), this);
  }
  if (is_root()) {
    if (training) step.order_known = true;
    else finish_step();
    return;
  }
  if (!training) {
    if (!step.held) return_to_shards();
    return;
  }
  // Without a hooked output nothing would gather the parameters again for
  // backward: keep them.
  // The last unit to start forward is the first in backward (after the
  // root's own layers): freeing its parameters only to gather them again
  // at once would cost a gather and save no memory.
  const bool backward_next = step.order_known && !step.forward_order.empty() && step.forward_order.back() == this;
  // A held step keeps every unit whole until it ends (begin_held_step).
  if (options_.reshard_after_forward && hooked && !backward_next && !step.held) use_sharded();
}

// ---- backward -------------------------------------------------------------

void FsdpUnit::pre_backward() {
  if (!step_->backward_queued) {
    step_->backward_queued = true;
    FsdpStep* step = step_.get();
    FsdpUnit* root = step->root;
    autograd::Engine::get_default_engine().queue_callback([root] { root->end_backward(); });
  }
  if (backward_prepared_) return;
  backward_prepared_ = true;
  FsdpTimeline* timeline = step_->timeline->on() ? step_->timeline.get() : nullptr;
  if (timeline) timeline->backward_entered(this);
  gather_now();
  if (timeline) timeline->backward_gathered(this);
  start_prefetch(step_->backward_order);
}

void FsdpUnit::on_gradient() {
  if (state_ != State::unsharded)
    throw Error(fmt::format(
        "fully_shard: a gradient of unit {} arrived while its parameters were not gathered: a parameter was used "
        "outside its unit's forward, or a tensor left the unit other than through its forward's outputs",
        name_));
  if (++gradients_ready_ == trained_.size()) post_backward();
}

// The unit's gradients end to end, zeros where a parameter got none and in
// the padding; the parameters' own gradients are dropped.
Tensor FsdpUnit::flat_gradients() {
  Tensor flat = ::torch::empty({layout_.flat_elements()}, shard_.options().dtype(reduce_dtype_));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Tensor place = flat.narrow(0, layout_.flat_offset(i), layout_.numel(i));
    Tensor& grad = params_[i].mutable_grad();
    if (!grad.defined()) {
      place.zero_();
      continue;
    }
    had_gradient_[i] = true;
    place.copy_(grad.reshape(-1));
    grad = Tensor();
  }
  flat.narrow(0, layout_.data_elements(), layout_.flat_elements() - layout_.data_elements()).zero_();
  return flat;
}

void FsdpUnit::post_backward() {
  if (reduced_) return;
  reduced_ = true;
  FsdpTimeline* timeline = step_->timeline->on() ? step_->timeline.get() : nullptr;
  if (timeline) timeline->backward_done(this);
  issue_reduce_scatter();
  if (timeline) timeline->backward_left(this);
}

void FsdpUnit::issue_reduce_scatter() {
  ::torch::NoGradGuard no_grad;
  Tensor flat = flat_gradients();
  if (step_->held) {  // reduced once every held shard's backward ran (finish_held_step)
    held_flats_.push_back(std::move(flat));
    return;
  }
  use_sharded();
  if (!gradient_sync_) {
    accumulated_ = accumulated_.defined() ? accumulated_.add_(flat) : flat;
    return;
  }
  if (accumulated_.defined()) {
    flat.add_(accumulated_);
    accumulated_ = Tensor();
  }
  if (alone_ || group_->size() == 1) {  // the average of one
    reduced_shard_ = flat.scalar_type() == dtype_ ? flat : flat.to(dtype_);
    return;
  }
  Tensor output = ::torch::empty({layout_.shard_elements()}, flat.options());
  pending_ = PendingReduce{options_.reduce_in_shard_order ? reduce_scatter_in_shard_order(flat, output)
                                                          : reduce_scatter_tensor(*group_, output, flat, ReduceOp::avg,
                                                                                  /*async_op=*/true),
                           flat, output};
  auto& reducing = step_->reducing;
  reducing.push_back(this);
  while (reducing.size() > static_cast<std::size_t>(options_.reduce_scatters_in_flight)) {
    FsdpUnit* oldest = reducing.front();
    reducing.erase(reducing.begin());
    oldest->finish_reduce();
  }
}

std::shared_ptr<Work> FsdpUnit::reduce_scatter_in_shard_order(const Tensor& flat, const Tensor& output) {
  if (!flat.is_cpu())
    throw InvalidArgument(fmt::format(
        "fully_shard: unit {} has reduce_in_shard_order set and its gradients on {}: that fold works on host memory "
        "only; leave it off for device memory",
        name_, flat.device().str()));
  std::vector<int> rank_holds_its_own(static_cast<std::size_t>(group_->size()));
  std::iota(rank_holds_its_own.begin(), rank_holds_its_own.end(), 0);
  return group_->reduce_scatter_shards({buffer_of(flat, "fully_shard's gradients")}, std::move(rank_holds_its_own),
                                       {buffer_of(output, "fully_shard's reduced shard")}, ReduceOp::avg);
}

void FsdpUnit::finish_reduce() {
  if (!pending_.work) return;
  auto pending = std::move(pending_);
  pending_ = PendingReduce{};
  wait_named(*pending.work, "reduce-scatter");
  reduced_shard_ = pending.output.scalar_type() == dtype_ ? pending.output : pending.output.to(dtype_);
}

// After the whole graph ran: units whose gradients did not all arrive
// (parameters unused this step, or frozen) reduce what they have, every
// reduce-scatter finishes, and every unit returns to its shards with their
// gradients.
void FsdpUnit::end_backward() {
  auto& step = *step_;
  for (auto it = step.backward_order.begin(); it != step.backward_order.end(); ++it)
    if ((*it)->backward_prepared_ && !(*it)->reduced_) (*it)->post_backward();
  for (FsdpUnit* unit : step.reducing) unit->finish_reduce();
  step.reducing.clear();
  agree_on_used_parameters();
  if (step.timeline->on()) {
    std::vector<const void*> order;
    std::vector<std::int64_t> parameters;
    for (const FsdpUnit* unit : step.forward_order) {
      order.push_back(unit);
      parameters.push_back(unit->layout_.data_elements());
    }
    step.timeline->write_step(order, parameters);
  }
  finish_step();
}

// One all-reduce of a flag per parameter of the model, after every
// backward that reduced gradients: whether any rank gave it a gradient.
void FsdpUnit::agree_on_used_parameters() {
  std::vector<std::int32_t> used;
  bool reducing = false;
  for (FsdpUnit* unit : step_->units) {
    reducing = reducing || unit->reduced_shard_.defined();
    for (std::size_t i = 0; i < unit->params_.size(); ++i) used.push_back(unit->had_gradient_[i] ? 1 : 0);
  }
  if (!reducing) return;
  if (step_group().size() > 1) step_group().allreduce(Buffer{used.data(), used.size(), DType::i32}, ReduceOp::max)->wait();
  std::size_t k = 0;
  for (FsdpUnit* unit : step_->units) {
    unit->used_anywhere_.assign(unit->params_.size(), false);
    for (std::size_t i = 0; i < unit->params_.size(); ++i) unit->used_anywhere_[i] = used[k++] != 0;
  }
}

void FsdpUnit::finish_step() {
  for (FsdpUnit* unit : step_->units) {
    if (step_->held) unit->end_held_backward();
    else unit->return_to_shards();
  }
  step_->in_step = false;
  step_->backward_queued = false;
}

// The unit's parameters back to their shards, with their gradients: those
// of before the step plus this step's reduced ones, for parameters that
// some rank used.
void FsdpUnit::return_to_shards() {
  if (state_ != State::sharded) use_sharded();
  if (stashed_) {
    const bool fresh = reduced_shard_.defined();
    bool viewed = false;  // a gradient made a view of the reduced shard
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Tensor grad = stash_[i];
      const ShardPiece& piece = pieces_[i];
      if (fresh && piece.count > 0 && params_[i].requires_grad() && used_anywhere_.at(i)) {
        viewed = viewed || !grad.defined();
        grad = grad.defined() ? grad.add_(reduced_shard_.narrow(0, piece.shard_offset, piece.count))
                              : piece_of(reduced_shard_, piece);
      }
      params_[i].mutable_grad() = grad;
    }
    if (viewed && keep_gradient_memory_) gradient_memory_ = reduced_shard_;
  }
  if (reduced_shard_.defined()) had_gradient_.assign(params_.size(), false);
  stash_.clear();
  stashed_ = false;
  reduced_shard_ = Tensor();
  backward_prepared_ = false;
  reduced_ = false;
  gradients_ready_ = 0;
}

void FsdpUnit::unshard() {
  gather_now();
}

void FsdpUnit::reshard_outside_step() {
  if (step_->in_step) throw InvalidArgument("fully_shard: reshard() during a step; call it after backward");
  finish_step();
}

}  // namespace lockstep::torch::detail
