// hook_with_zero_step: a comm hook that steps a ZeroRedundancyOptimizer's
// shard bucket by bucket as DDP's reductions complete, and the bookkeeping
// that lets zero.step() check it. Thread-safety: see zero_overlap.h and
// zero_overlap_state.h.
#include "lockstep/torch/zero_overlap.h"

#include <fmt/format.h>

#include <cstddef>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "lockstep/error.h"
#include "zero_overlap_state.h"

namespace lockstep::torch {
namespace detail {
namespace {

const void* identity(const ::torch::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Puts the parameters of each group of `optimizer` back as they were when
// it was made, whatever the step in between threw.
class RestoreGroups {
 public:
  explicit RestoreGroups(::torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
    for (auto& group : optimizer_.param_groups()) saved_.push_back(group.params());
  }
  ~RestoreGroups() {
    auto& groups = optimizer_.param_groups();
    for (std::size_t g = 0; g < saved_.size() && g < groups.size(); ++g) groups[g].params() = std::move(saved_[g]);
  }
  RestoreGroups(const RestoreGroups&) = delete;
  RestoreGroups& operator=(const RestoreGroups&) = delete;

 private:
  ::torch::optim::Optimizer& optimizer_;
  std::vector<std::vector<::torch::Tensor>> saved_;
};

}  // namespace

// The averaged gradient goes into param.grad(), where the optimizer reads
// it. Unless gradients are bucket views, param.grad() is then the bucket
// the reduction read from (or autograd's own tensor on the first step),
// which nothing reads again: DDP's finalize points the gradient at the
// average afterwards, with the same values. The shard's optimizer steps
// with its groups narrowed to this bucket's parameters, so its state stays
// where consolidate_state_dict() and load() expect it.
void ZeroOverlap::step(ZeroRedundancyOptimizer& zero, const std::vector<BucketParam>& params) {
  std::lock_guard lock(mutex_);
  ::torch::NoGradGuard no_grad;
  std::unordered_set<const void*> mine;
  for (const auto& [param, averaged, owned] : params) {
    stepped_.insert(identity(param));
    if (!owned) continue;
    ::torch::Tensor& grad = param.mutable_grad();
    if (!grad.defined()) {
      grad = averaged.view_as(param).clone();
    } else if (grad.data_ptr() != averaged.data_ptr()) {
      grad.copy_(averaged.view_as(grad));
    }
    mine.insert(identity(param));
  }
  ::torch::optim::Optimizer* local = zero.local_optimizer();
  if (mine.empty() || local == nullptr) return;
  RestoreGroups restore(*local);
  auto& groups = local->param_groups();
  const auto& options = zero.param_groups();  // a scheduler changes these between steps
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g < options.size()) groups[g].set_options(options[g].options().clone());
    std::vector<::torch::Tensor> narrowed;
    for (const auto& p : groups[g].params())
      if (mine.count(identity(p)) != 0) narrowed.push_back(p);
    groups[g].params() = std::move(narrowed);
  }
  local->step();
}

void ZeroOverlap::finish_step(ZeroRedundancyOptimizer& zero) {
  if (!zero.overlap_)
    throw InvalidArgument(
        "ZeroRedundancyOptimizer::step: built with overlap_with_ddp, its shard is stepped by DDP's comm hook, and "
        "none is registered; call ddp.register_comm_hook(hook_with_zero_step(allreduce_hook(), ddp, zero)) before "
        "the first forward");
  ZeroOverlap& overlap = *zero.overlap_;
  std::lock_guard lock(overlap.mutex_);
  std::size_t missing = 0;
  for (const auto& p : zero.parameters()) missing += overlap.stepped_.count(identity(p)) == 0 ? 1 : 0;
  overlap.stepped_.clear();
  if (missing != 0)
    throw InvalidArgument(fmt::format(
        "ZeroRedundancyOptimizer::step: built with overlap_with_ddp, step() only all-gathers what DDP's comm hook "
        "stepped, but {} of {} parameters were in no bucket reduced since the last step(); run the backward of "
        "the DDP module's output before each step()",
        missing, zero.parameters().size()));
}

std::shared_ptr<ZeroOverlap> ZeroOverlap::attach(ZeroRedundancyOptimizer& zero) {
  if (zero.overlap_)
    throw InvalidArgument(
        "hook_with_zero_step: this ZeroRedundancyOptimizer is already stepped by another hook_with_zero_step; "
        "make one per optimizer (and one optimizer per DDP)");
  zero.overlap_ = std::make_shared<ZeroOverlap>();
  return zero.overlap_;
}

}  // namespace detail

namespace {

// The wrapper around the user's hook. run() is called on the backward
// thread, bucket by bucket in bucket order; the step runs where the
// reduction's Work completes.
class ZeroStepHook final : public CommHook {
 public:
  ZeroStepHook(std::shared_ptr<CommHook> inner, std::map<std::string, ::torch::Tensor> ddp_params,
               ZeroRedundancyOptimizer& zero, ZeroStepSchedule schedule)
      : inner_(std::move(inner)), ddp_params_(std::move(ddp_params)), zero_(zero), schedule_(schedule) {
    for (std::size_t i = 0; i < zero.parameters().size(); ++i)
      zero_index_.emplace(zero.parameters()[i].unsafeGetTensorImpl(), i);
    overlap_ = detail::ZeroOverlap::attach(zero);
  }

  std::string name() const override {
    return fmt::format("{}({})",
                       schedule_ == ZeroStepSchedule::interleaved ? "hook_with_zero_step_interleaved"
                                                                  : "hook_with_zero_step",
                       inner_->name());
  }
  bool out_of_place() const override { return inner_->out_of_place(); }
  // On CUDA the average is final only after finish() on the waiting thread.
  bool supports(Device device) const override { return !device.is_cuda() && inner_->supports(device); }
  void finish(const GradBucket& bucket) override { inner_->finish(bucket); }

  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override {
    std::shared_ptr<Work> reduced = inner_->run(pg, bucket);
    auto params = bucket_params(pg, bucket);
    auto overlap = overlap_;
    ZeroRedundancyOptimizer& zero = zero_;
    if (schedule_ == ZeroStepSchedule::interleaved)
      return reduced->then([overlap, &zero, params = std::move(params)](const Work&) { overlap->step(zero, params); });
    // after_backward: the last bucket is launched once backward is over;
    // its continuation steps every bucket, each after its own reduction
    // (a group completes its operations in the order they were issued, so
    // the earlier ones are done by then).
    if (bucket.index == 0) pending_.clear();
    pending_.push_back(Pending{reduced, std::move(params)});
    if (!bucket.last) return reduced;
    auto pending = std::move(pending_);
    pending_.clear();
    return reduced->then([overlap, &zero, pending = std::move(pending)](const Work&) {
      for (const auto& p : pending) {
        p.reduced->wait();
        overlap->step(zero, p.params);
      }
    });
  }

 private:
  struct Pending {
    std::shared_ptr<Work> reduced;
    std::vector<detail::BucketParam> params;
  };

  // The bucket's parameters with views of their averages in bucket.buffer,
  // and whether this rank owns each (asked here, on the backward thread).
  std::vector<detail::BucketParam> bucket_params(ProcessGroup& pg, const GradBucket& bucket) {
    std::vector<detail::BucketParam> out;
    auto* base = static_cast<std::byte*>(bucket.buffer.data);
    for (std::size_t k = 0; k < bucket.layout->params.size(); ++k) {
      const ParamSpec& spec = (*bucket.params)[bucket.layout->params[k]];
      const auto found = ddp_params_.find(spec.name);
      if (found == ddp_params_.end()) continue;  // checked at construction: not one of zero's
      const ::torch::Tensor& param = found->second;
      const auto index = zero_index_.find(param.unsafeGetTensorImpl());
      if (index == zero_index_.end()) continue;  // DDP reduces it, another optimizer steps it
      void* at = base + bucket.layout->offsets[k] * dtype_size(bucket.buffer.dtype);
      auto averaged = ::torch::from_blob(at, param.sizes(), param.options().requires_grad(false));
      out.push_back({param, averaged, zero_.owner(index->second) == pg.rank()});
    }
    return out;
  }

  std::shared_ptr<CommHook> inner_;
  std::map<std::string, ::torch::Tensor> ddp_params_;
  ZeroRedundancyOptimizer& zero_;
  ZeroStepSchedule schedule_;
  std::unordered_map<const void*, std::size_t> zero_index_;  // TensorImpl -> index in zero.parameters()
  std::shared_ptr<detail::ZeroOverlap> overlap_;
  std::vector<Pending> pending_;  // after_backward: the buckets of this backward so far
};

}  // namespace

std::shared_ptr<CommHook> hook_with_zero_step(std::shared_ptr<CommHook> hook,
                                              const std::vector<std::pair<std::string, ::torch::Tensor>>& ddp_params,
                                              ZeroRedundancyOptimizer& zero, ZeroStepSchedule schedule) {
  if (!hook) throw InvalidArgument("hook_with_zero_step: the hook is null (pass allreduce_hook() for a plain average)");
  if (!zero.zero_options().overlap_with_ddp)
    throw InvalidArgument(
        "hook_with_zero_step: the ZeroRedundancyOptimizer was built without overlap_with_ddp; build it with "
        "ZeroOptions{.overlap_with_ddp = true}");
  if (zero.zero_options().partition != ZeroPartition::by_tensor)
    throw InvalidArgument(
        "hook_with_zero_step: overlap_with_ddp steps whole parameters; build the ZeroRedundancyOptimizer with "
        "ZeroPartition::by_tensor");
  std::map<std::string, ::torch::Tensor> reduced;  // what DDP reduces: the parameters that require grad
  std::unordered_set<const void*> reduced_identity;
  for (const auto& [name, t] : ddp_params) {
    if (!t.requires_grad()) continue;
    reduced.emplace(name, t);
    reduced_identity.insert(t.unsafeGetTensorImpl());
  }
  for (std::size_t i = 0; i < zero.parameters().size(); ++i)
    if (reduced_identity.count(zero.parameters()[i].unsafeGetTensorImpl()) == 0)
      throw InvalidArgument(fmt::format(
          "hook_with_zero_step: parameter {} of the ZeroRedundancyOptimizer is not one the DDP module reduces (a "
          "parameter of another module, or one that does not require grad), so no bucket would step it",
          i));
  return std::make_shared<ZeroStepHook>(std::move(hook), std::move(reduced), zero, schedule);
}

}  // namespace lockstep::torch
