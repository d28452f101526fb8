// Fully sharded data parallel for libtorch (ZeRO-3; PyTorch's FSDP2,
// torch.distributed.fsdp.fully_shard): each rank keeps 1/N of every
// parameter, gradient and optimizer state. A unit's parameters are
// all-gathered just before its forward and again before its backward, and
// freed after each; its gradients are reduce-scattered into the shards as
// backward produces them.
//
//   auto pg = lockstep::init_process_group();
//   torch::nn::Sequential net;
//   for (int i = 0; i < 8; ++i)                                  // the blocks first ...
//     net->push_back(lockstep::torch::fully_shard(Block(1024), pg));
//   auto model = lockstep::torch::fully_shard(net, pg);         // ... then the root
//   torch::optim::AdamW opt(model->parameters(), 1e-3);          // steps the shards
//   for (auto& batch : loader) {                                 // each rank: its shard of the batch
//     opt.zero_grad();
//     loss_fn(model->forward(batch.data), batch.target).backward();
//     opt.step();
//   }
//
// Where FSDP2 changes a module's class in place, C++ cannot: fully_shard
// returns a wrapper, a module whose forward has the wrapped module's
// signature (so it goes wherever the module went: a Sequential, a
// ModuleList, a member of type std::shared_ptr<FullyShard<BlockImpl>>)
// and whose parameters, buffers and children carry the wrapped module's
// names. Call the wrapper's forward, not the wrapped module's: the wrapper
// is where the parameters are gathered (docs/fsdp.md, "Why a wrapper").
//
// Between steps each parameter tensor holds this rank's piece of it: the
// unit's parameters are laid end to end, padded to a multiple of the world
// size and cut into N equal shards (docs/fsdp.md, "Layout"), so a parameter
// is a 1-D tensor of the elements that fall in this rank's shard (possibly
// none). Optimizers that update every element from its own gradient and
// state (SGD, Adam, AdamW, Adagrad, RMSprop) step the pieces exactly as
// they would step the whole tensors. full_state_dict() gives the whole
// tensors back.
//
// Construction is collective: every rank wraps the same modules in the same
// order; rank 0's parameters and buffers are broadcast (sync_module_states).
// Forward and backward are collective: every rank runs the same units in
// the same order. A rank that skips a unit fails with an error naming the
// unit (each unit's all-gather has a count of its own), not a hang.
//
// Not supported: lockstep::torch::Join (a wrapper is not Joinable: uneven
// inputs would leave the other ranks' all-gathers without a partner; make
// every rank run the same number of steps), parameters of several dtypes
// in one unit (shard them in units of their own), and parameters used
// outside their unit's forward.
//
// Thread-safety: drive the model from one thread, like the module itself.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/module_outputs.h"

namespace lockstep::torch {

// FSDP2's MixedPrecisionPolicy.
struct MixedPrecisionPolicy {
  // Parameters are all-gathered and used in forward and backward in this
  // dtype (e.g. ::torch::kBFloat16); the shards and the optimizer stay in
  // the parameters' own dtype. Unset: the parameters' dtype.
  std::optional<::torch::ScalarType> param_dtype;
  // Gradients are reduce-scattered in this dtype, then cast to the
  // parameters' dtype. Unset: param_dtype, or the parameters' dtype.
  std::optional<::torch::ScalarType> reduce_dtype;
  // Floating-point tensor arguments of each unit's forward are cast to
  // param_dtype.
  bool cast_forward_inputs = true;
};

struct FullyShardOptions {
  // Free the gathered parameters after the unit's forward and gather them
  // again for its backward (ZeRO-3). false keeps them from forward to the
  // end of backward (ZeRO-2: one all-gather per step, more memory). The
  // root unit keeps them regardless, since its backward starts at once.
  bool reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
  // How many units ahead are all-gathered while the current one computes,
  // in forward and in backward (the order is the first step's). 0: none.
  int prefetch = 1;
  // Reduce-scatters issued and not yet finished, at most; backward waits
  // for the oldest beyond this (each holds a unit's unsharded gradients).
  int reduce_scatters_in_flight = 2;
  // Broadcast rank 0's parameters and buffers at construction.
  bool sync_module_states = true;
  // Reduce-scatter the gradients with every element folded over the ranks'
  // gradients in rank order, one kernel, whatever the backend
  // (ProcessGroup::reduce_scatter_shards; on shm that is what its
  // reduce-scatter does anyway, at the same speed). A step that goes on
  // after a rank's death, its shard held by a survivor (begin_held_step),
  // folds that way, so only a job whose clean steps fold that way gets a
  // clean run's bits from it: ShardBackup sets this. Host memory only.
  bool reduce_in_shard_order = false;
};

namespace detail {
class FsdpUnit;
// A Tensor argument cast for the unit (mixed precision); anything else as it came.
::torch::Tensor cast_forward_input(FsdpUnit& unit, const ::torch::Tensor& t);
template <typename T, typename = std::enable_if_t<!std::is_same_v<std::decay_t<T>, ::torch::Tensor>>>
T&& cast_forward_input(FsdpUnit&, T&& value) {
  return std::forward<T>(value);
}
// Gathers the unit's parameters (or waits for the prefetch) and starts the
// next unit's gather; marks the start of a step at the root.
void before_forward(FsdpUnit& unit);
// Hooks the outputs' gradients (the unit's backward starts there) and
// reshards the unit.
void after_forward(FsdpUnit& unit, const std::vector<::torch::Tensor>& outputs);
}  // namespace detail

// What every wrapper has, whatever module it wraps: FSDP2's FSDPModule.
class FullyShardModule : public ::torch::nn::Module {
 public:
  ~FullyShardModule() override;

  // FSDP2's set_requires_gradient_sync: false makes backward keep the
  // unsharded gradients and accumulate them (no communication; memory of
  // the whole model's gradients); the next backward with true
  // reduce-scatters the sum. Applies to this unit and the units inside it.
  void set_requires_gradient_sync(bool sync);
  void set_reshard_after_forward(bool reshard);
  // Gathers / frees this unit's parameters outside forward (e.g. to read
  // them whole). Collective.
  void unshard();
  void reshard();

  // Every parameter (this unit's and the units' inside it) whole, by name,
  // on rank `to` (the others get an empty map), in the parameters' dtype,
  // on the CPU. Collective.
  std::map<std::string, ::torch::Tensor> full_state_dict(int to = 0);
  // Takes the whole parameters and buffers (by name; e.g. from
  // full_state_dict() at any world size) and keeps this rank's shard.
  // Every rank passes the same values; not collective. Throws
  // InvalidArgument naming a missing or misshapen entry.
  void load_full_state_dict(const std::map<std::string, ::torch::Tensor>& state);
  // Each rank's shards (and buffers) by name, for a sharded checkpoint
  // (save_sharded_checkpoint); loadable only at the same world size.
  std::map<std::string, ::torch::Tensor> sharded_state_dict();
  void load_sharded_state_dict(const std::map<std::string, ::torch::Tensor>& state);

  ProcessGroup& group() const;
  const FullyShardOptions& options() const;
  // The unit's own parameters (not those of units inside it): elements
  // before padding, and this rank's shard size.
  std::int64_t unit_elements() const;
  std::int64_t shard_elements() const;
  detail::FsdpUnit& unit() { return *unit_; }
  const std::shared_ptr<detail::FsdpUnit>& unit_ptr() const { return unit_; }

 protected:
  FullyShardModule(const std::shared_ptr<::torch::nn::Module>& inner, std::shared_ptr<ProcessGroup> group,
                   FullyShardOptions options);
  std::shared_ptr<detail::FsdpUnit> unit_;
};

// What the wrappers of ModuleImpl share; FullyShardImpl adds the forward.
template <typename ModuleImpl>
class FullyShardWrapper : public FullyShardModule {
 public:
  FullyShardWrapper(std::shared_ptr<ModuleImpl> module, std::shared_ptr<ProcessGroup> group,
                    FullyShardOptions options = {})
      : FullyShardModule(module, std::move(group), std::move(options)), module_(std::move(module)) {}
  // The wrapped module (its members, for what it holds besides forward).
  ModuleImpl& module() { return *module_; }
  const std::shared_ptr<ModuleImpl>& module_ptr() const { return module_; }

 protected:
  // Runs call(unit) (the wrapped forward) between the unit's gather and reshard.
  template <typename Call>
  decltype(auto) run(Call&& call) {
    detail::before_forward(*unit_);
    decltype(auto) out = call(*unit_);
    std::vector<::torch::Tensor> tensors;
    detail::collect(tensors, out);
    detail::after_forward(*unit_, tensors);
    return out;
  }
  std::shared_ptr<ModuleImpl> module_;
};

namespace detail {
template <typename ModuleImpl, typename = void>
struct ForwardOf {
  using type = void;  // a template or overloaded forward
};
template <typename ModuleImpl>
struct ForwardOf<ModuleImpl, std::void_t<decltype(&ModuleImpl::forward)>> {
  using type = decltype(&ModuleImpl::forward);
};
}  // namespace detail

// The wrapper of ModuleImpl. Its forward takes what ModuleImpl::forward
// takes: exactly, when ModuleImpl::forward is one function (so that a
// Sequential or AnyModule can hold the wrapper); forwarded otherwise (a
// template forward, e.g. a Sequential as the root).
template <typename ModuleImpl, typename Forward = typename detail::ForwardOf<ModuleImpl>::type>
class FullyShardImpl : public FullyShardWrapper<ModuleImpl> {
 public:
  using FullyShardWrapper<ModuleImpl>::FullyShardWrapper;
  template <typename... Args>
  auto forward(Args&&... args) {
    return this->run([&](detail::FsdpUnit& unit) {
      return this->module_->forward(detail::cast_forward_input(unit, std::forward<Args>(args))...);
    });
  }
};
template <typename ModuleImpl, typename R, typename... Args>
class FullyShardImpl<ModuleImpl, R (ModuleImpl::*)(Args...)> : public FullyShardWrapper<ModuleImpl> {
 public:
  using FullyShardWrapper<ModuleImpl>::FullyShardWrapper;
  R forward(Args... args) {
    return this->run([&](detail::FsdpUnit& unit) -> R {
      return this->module_->forward(detail::cast_forward_input(unit, std::forward<Args>(args))...);
    });
  }
};
template <typename ModuleImpl, typename R, typename... Args>
class FullyShardImpl<ModuleImpl, R (ModuleImpl::*)(Args...) const> : public FullyShardWrapper<ModuleImpl> {
 public:
  using FullyShardWrapper<ModuleImpl>::FullyShardWrapper;
  R forward(Args... args) {
    return this->run([&](detail::FsdpUnit& unit) -> R {
      return this->module_->forward(detail::cast_forward_input(unit, std::forward<Args>(args))...);
    });
  }
};

// The wrapper type fully_shard returns for ModuleImpl (FullyShardImpl<ModuleImpl>).
template <typename ModuleImpl>
using FullyShard = FullyShardImpl<ModuleImpl>;

// Makes `module` a sharding unit of `group`: its parameters (except those
// of units already made inside it: apply fully_shard to the blocks first,
// then to the root) are flattened, sharded, and freed on this rank except
// for its shard. Use the returned wrapper in the module's place.
// Collective.
template <typename ModuleImpl>
std::shared_ptr<FullyShard<ModuleImpl>> fully_shard(std::shared_ptr<ModuleImpl> module,
                                                    std::shared_ptr<ProcessGroup> group,
                                                    FullyShardOptions options = {}) {
  return std::make_shared<FullyShard<ModuleImpl>>(std::move(module), std::move(group), std::move(options));
}
// For a module holder (torch::nn::Linear, torch::nn::Sequential, a
// TORCH_MODULE type).
template <typename ModuleImpl>
std::shared_ptr<FullyShard<ModuleImpl>> fully_shard(const ::torch::nn::ModuleHolder<ModuleImpl>& module,
                                                    std::shared_ptr<ProcessGroup> group,
                                                    FullyShardOptions options = {}) {
  return fully_shard(module.ptr(), std::move(group), std::move(options));
}

// Clips the gradients of every parameter of `model` (the root wrapper) by
// their global norm, as torch::nn::utils::clip_grad_norm_ on the whole
// model would: each rank's shards' norms are combined with one all-reduce.
// Returns the norm before clipping. Collective.
double clip_grad_norm_(FullyShardModule& model, double max_norm, double norm_type = 2.0);

// A sharded checkpoint: each rank writes its shards and buffers to
// `<path>.rank<r>-of-<n>` (atomically, with the checkpoint format's CRCs),
// with the optimizer's state when given and the steps taken so far (for a
// resumed job's step counter, seeds and data position). Each rank keeps its
// previous file (`.previous`) until every rank has written the new one, so
// a job stopped mid-save still holds a step every rank saved. Loading needs
// the same world size (use full_state_dict for another one). Collective:
// every rank learns whether every rank saved (Error with a failed rank's
// reason otherwise).
void save_sharded_checkpoint(FullyShardModule& model, const std::string& path,
                             ::torch::optim::Optimizer* optimizer = nullptr, std::uint64_t steps = 0);
// Loads the newest step every rank holds (its file's or the previous
// one's). Returns false on every rank when no rank has a file; throws Error
// on every rank when some have and some not, when no step is held by every
// rank, or when a file is unusable. `steps`, when given, gets the steps
// saved (0 from a file written without them).
bool load_sharded_checkpoint(FullyShardModule& model, const std::string& path,
                             ::torch::optim::Optimizer* optimizer = nullptr, std::uint64_t* steps = nullptr);

}  // namespace lockstep::torch
