// DistributedDataParallel for libtorch: autograd hooks, the search for unused
// parameters, buffer broadcast and the bridge between param.grad() and the
// Reducer's buckets. See lockstep/torch/ddp.h.
#include "lockstep/torch/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <unordered_set>

#include <fmt/format.h>

#include "common/clock.h"
#include "lockstep/error.h"

namespace lockstep::torch {
namespace {

namespace autograd = ::torch::autograd;

// param.grad() as the Reducer needs it: contiguous, created on demand, and
// re-pointable into a bucket.
class TorchGradients final : public GradientSource {
 public:
  explicit TorchGradients(std::vector<::torch::Tensor> params) : params_(std::move(params)) {}

  void* gradient(std::size_t i) override {
    ::torch::Tensor& p = params_[i];
    ::torch::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) {
      grad = ::torch::zeros_like(p, ::torch::MemoryFormat::Contiguous);
    } else if (!grad.is_contiguous()) {
      grad = grad.contiguous();
    }
    return grad.data_ptr();
  }

  void use_as_gradient(std::size_t i, void* slot) override {
    ::torch::Tensor& p = params_[i];
    p.mutable_grad() = ::torch::from_blob(slot, p.sizes(), p.options().requires_grad(false));
  }

 private:
  std::vector<::torch::Tensor> params_;
};

ReducerOptions reducer_options(const DDPOptions& o) {
  ReducerOptions r;
  r.buckets.bucket_cap_bytes = static_cast<std::size_t>(o.bucket_cap_mb * 1024 * 1024);
  r.buckets.first_bucket_bytes = static_cast<std::size_t>(o.first_bucket_mb * 1024 * 1024);
  r.find_unused_parameters = o.find_unused_parameters;
  r.static_graph = o.static_graph;
  r.gradient_as_bucket_view = o.gradient_as_bucket_view;
  r.comm_hook = o.comm_hook;
  return r;
}

}  // namespace

struct DataParallelCore::State {
  std::shared_ptr<::torch::nn::Module> module;
  std::shared_ptr<ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::string> names;
  std::vector<::torch::Tensor> params;
  std::vector<::torch::Tensor> buffers;
  std::unique_ptr<TorchGradients> gradients;
  std::unique_ptr<Reducer> reducer;
  // Each parameter's gradient accumulator and the key of our hook on it;
  // holding the accumulator keeps it (and so the hook) alive.
  std::vector<std::pair<std::shared_ptr<autograd::Node>, std::uintptr_t>> hooks;
  bool finalize_queued = false;
  bool first_forward = true;
  StepTimes times;

  void on_gradient(std::size_t i) {
    // The first gradient of a backward pass schedules the end-of-backward
    // step; autograd runs it once the whole graph is done.
    if (!finalize_queued) {
      finalize_queued = true;
      autograd::Engine::get_default_engine().queue_callback([this] {
        finalize_queued = false;
        reducer->finalize();
        times.backward = reducer->last_step();
      });
    }
    reducer->mark_ready(i);
  }

  // Parameters whose gradient accumulator cannot be reached from the
  // outputs: they will get no gradient this iteration.
  std::vector<std::size_t> unused_parameters(const std::vector<::torch::Tensor>& outputs) const {
    std::unordered_set<const autograd::Node*> seen;
    std::vector<autograd::Node*> stack;
    for (const auto& t : outputs) {
      if (t.defined() && t.requires_grad() && t.grad_fn() && seen.insert(t.grad_fn().get()).second)
        stack.push_back(t.grad_fn().get());
    }
    while (!stack.empty()) {
      autograd::Node* node = stack.back();
      stack.pop_back();
      for (const auto& edge : node->next_edges())
        if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
    }
    std::vector<std::size_t> unused;
    for (std::size_t i = 0; i < hooks.size(); ++i)
      if (!seen.count(hooks[i].first.get())) unused.push_back(i);
    return unused;
  }
};

DataParallelCore::DataParallelCore(std::shared_ptr<::torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                                   DDPOptions options)
    : state_(std::make_unique<State>()) {
  auto& s = *state_;
  s.module = std::move(module);
  s.pg = std::move(pg);
  s.options = std::move(options);
  std::vector<std::pair<std::string, ::torch::Tensor>> named_params, named_buffers;
  for (const auto& item : s.module->named_parameters(/*recurse=*/true)) named_params.emplace_back(item.key(), item.value());
  for (const auto& item : s.module->named_buffers(/*recurse=*/true)) named_buffers.emplace_back(item.key(), item.value());
  verify_same_across_ranks(*s.pg, named_params, "parameters");
  verify_same_across_ranks(*s.pg, named_buffers, "buffers");

  // Start every replica from rank 0's state.
  std::vector<::torch::Tensor> all;
  for (const auto& [name, t] : named_params) all.push_back(t);
  for (const auto& [name, t] : named_buffers) {
    all.push_back(t);
    s.buffers.push_back(t);
  }
  broadcast_coalesced(*s.pg, all, 0);

  std::vector<ParamSpec> specs;
  for (const auto& [name, t] : named_params) {
    if (!t.requires_grad()) continue;  // frozen parameters are not reduced
    s.names.push_back(name);
    s.params.push_back(t);
    specs.push_back(ParamSpec{name, static_cast<std::size_t>(t.numel()), dtype_of(t.scalar_type())});
  }
  s.gradients = std::make_unique<TorchGradients>(s.params);
  s.reducer = std::make_unique<Reducer>(s.pg, std::move(specs), *s.gradients, reducer_options(s.options));

  for (std::size_t i = 0; i < s.params.size(); ++i) {
    auto accumulator = autograd::impl::grad_accumulator(s.params[i]);
    State* state = state_.get();
    const auto key = accumulator->add_post_hook(std::make_unique<autograd::utils::LambdaPostHook>(
        [state, i](const autograd::variable_list& outputs, const autograd::variable_list&) {
          state->on_gradient(i);
          return outputs;
        }));
    s.hooks.emplace_back(std::move(accumulator), key);
  }
}

DataParallelCore::~DataParallelCore() {
  // The module may outlive us: take our hooks off its parameters.
  for (auto& [accumulator, key] : state_->hooks) accumulator->del_post_hook(key);
}

void DataParallelCore::before_forward() {
  auto& s = *state_;
  s.times.forward_start_us = now_us();
  s.reducer->check_previous_iteration();
  if (s.finalize_queued)
    throw InvalidArgument("DistributedDataParallel: forward called while the previous backward pass is still "
                          "running; finish backward() first");
  // Collective (every rank reaches its first training forward after the
  // first synchronised step at the same point); gradient views, if any, are
  // re-pointed by the Reducer.
  if (::torch::GradMode::is_enabled() && s.module->is_training()) s.reducer->maybe_rebuild_buckets();
  if (s.options.broadcast_buffers && !s.buffers.empty()) broadcast_coalesced(*s.pg, s.buffers, 0);
}

void DataParallelCore::after_forward(const std::vector<::torch::Tensor>& outputs) {
  auto& s = *state_;
  s.times.forward_end_us = now_us();
  if (!::torch::GradMode::is_enabled() || !s.reducer->sync()) return;
  // A static graph's unused parameters are known after the first iteration.
  const bool search = s.options.find_unused_parameters && !(s.options.static_graph && s.reducer->iterations() > 0);
  s.reducer->prepare_for_backward(search ? s.unused_parameters(outputs) : std::vector<std::size_t>{});
}

Reducer& DataParallelCore::reducer() { return *state_->reducer; }
const Reducer& DataParallelCore::reducer() const { return *state_->reducer; }
ProcessGroup& DataParallelCore::group() const { return *state_->pg; }
const StepTimes& DataParallelCore::last_step() const { return state_->times; }

std::vector<std::vector<std::string>> DataParallelCore::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : state_->reducer->buckets()) {
    out.emplace_back();
    for (std::size_t i : b.params) out.back().push_back(state_->names[i]);
  }
  return out;
}

}  // namespace lockstep::torch
