// SyncBatchNorm's forward and backward over the global batch (an autograd
// Function with one all-reduce each way), and the conversion of BatchNorm
// layers. Stateless beyond the module; thread-safety as any module.
#include "lockstep/torch/sync_batchnorm.h"

#include <fmt/format.h>

#include <cstdint>
#include <sstream>
#include <utility>

#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch {
namespace {

using ::torch::Tensor;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// Every dimension but the channel one (1): the statistics are per channel.
std::vector<std::int64_t> reduced_dims(const Tensor& input) {
  std::vector<std::int64_t> dims{0};
  for (std::int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// (C) -> (1, C, 1, ...) to broadcast against the input.
Tensor per_channel(const Tensor& v, const Tensor& input) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(input.dim()), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

// On a GPU the all-reduce runs after the current stream's prior work (the
// sums queued just before), and wait() makes that stream wait for it
// without blocking the host: what is queued next reads the global sums.
void allreduce_sum(ProcessGroup& group, Tensor& t) {
  group.allreduce(buffer_of(t, "SyncBatchNorm's statistics"), ReduceOp::sum)->wait();
}

// The global batch's [sum(x), sum(x^2)] per channel (in double, on the
// input's device) and its count of values per channel. On the CPU the count
// travels with the sums (one all-reduce); on a GPU it is all-reduced on its
// own in host memory, from the input's shape, so that the host learns it
// (for the check below and the running variance's correction) without
// waiting for the device.
std::pair<Tensor, double> global_statistics(ProcessGroup& group, const Tensor& input) {
  const auto dims = reduced_dims(input);
  const std::int64_t channels = input.size(1);
  const double local_count = static_cast<double>(input.numel() / std::max<std::int64_t>(channels, 1));
  Tensor sums = ::torch::cat({input.sum(dims, false, ::torch::kDouble), input.square().sum(dims, false, ::torch::kDouble)});
  if (input.is_cpu()) {
    Tensor stats = ::torch::cat({::torch::full({1}, local_count, ::torch::kDouble), sums});
    allreduce_sum(group, stats);
    return {stats.slice(0, 1), stats[0].item<double>()};
  }
  double count = local_count;
  group.allreduce(Buffer{&count, 1, DType::f64}, ReduceOp::sum)->wait();
  allreduce_sum(group, sums);
  return {sums, count};
}

// Forward: y = (x - mean) * invstd * weight + bias with the global batch's
// mean and variance. The statistics are accumulated in double (the count,
// sum(x) and sum(x^2) all-reduced: global_statistics), so the variance is
// E[x^2] - E[x]^2, which in float would lose digits to cancellation.
// Everything but the count stays on the input's device.
// Backward (with N the global count, x̂ = (x - mean) * invstd):
//   dx = (dy - sum(dy)/N - (x - mean) * invstd^2 * sum(dy * (x - mean))/N) * invstd * weight
// where the two sums run over the global batch (the second all-reduce);
// dweight = sum(dy * x̂) and dbias = sum(dy) over this rank's batch only.
struct SyncBatchNormFunction : ::torch::autograd::Function<SyncBatchNormFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight, const Tensor& bias,
                        Tensor running_mean, Tensor running_var, double eps, double momentum,
                        ProcessGroup* group) {
    const std::int64_t channels = input.size(1);
    auto [stats, count] = global_statistics(*group, input);
    if (count <= 1)
      throw InvalidArgument(fmt::format(
          "SyncBatchNorm: the global batch has {} value(s) per channel over {} rank(s); training needs more than 1 "
          "(use larger batches, or eval mode)",
          count, group->size()));
    Tensor mean = stats.slice(0, 0, channels) / count;
    Tensor var = (stats.slice(0, channels) / count - mean.square()).clamp_min(0);
    Tensor invstd = (var + eps).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
      running_var.mul_(1 - momentum).add_((var * (count / (count - 1))).to(running_var.scalar_type()), momentum);
    }
    Tensor scale = weight.defined() ? invstd * weight.to(::torch::kDouble) : invstd;
    Tensor out = (input - per_channel(mean.to(input.scalar_type()), input)) *
                 per_channel(scale.to(input.scalar_type()), input);
    if (bias.defined()) out = out + per_channel(bias, input);
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    // The group outlives the graph as it must outlive every collective on
    // it; saved_data holds only IValues, hence its address as an integer.
    ctx->saved_data["group"] = static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(group));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    auto* group = reinterpret_cast<ProcessGroup*>(static_cast<std::intptr_t>(ctx->saved_data["group"].toInt()));
    const Tensor& dy = grads[0];
    const auto dims = reduced_dims(input);
    const std::int64_t channels = input.size(1);
    Tensor xmu = input - per_channel(mean.to(input.scalar_type()), input);
    Tensor sums = ::torch::cat({dy.sum(dims, false, ::torch::kDouble), (dy * xmu).sum(dims, false, ::torch::kDouble)});

    Tensor grad_input, grad_weight, grad_bias;
    if (weight.defined() && ctx->needs_input_grad(1))
      grad_weight = (sums.slice(0, channels) * invstd).to(weight.scalar_type());
    // A copy even when the types match: `sums` is all-reduced in place below.
    if (weight.defined() && ctx->needs_input_grad(2))
      grad_bias = sums.slice(0, 0, channels).to(weight.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    if (ctx->needs_input_grad(0)) {
      allreduce_sum(*group, sums);
      Tensor mean_dy = sums.slice(0, 0, channels) / count;
      Tensor mean_dy_xmu = sums.slice(0, channels) / count;
      Tensor scale = weight.defined() ? invstd * weight.to(::torch::kDouble) : invstd;
      const auto type = input.scalar_type();
      grad_input = (dy - per_channel(mean_dy.to(type), input) -
                    xmu * per_channel((invstd.square() * mean_dy_xmu).to(type), input)) *
                   per_channel(scale.to(type), input);
    }
    return {grad_input, grad_weight, grad_bias, Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The layer's parameters and buffers must be where its input is: the
// statistics are computed and all-reduced there.
void check_same_device(const Tensor& input, const SyncBatchNormImpl& layer) {
  const std::pair<const char*, const Tensor*> held[] = {{"weight", &layer.weight},
                                                        {"bias", &layer.bias},
                                                        {"running_mean", &layer.running_mean},
                                                        {"running_var", &layer.running_var}};
  for (const auto& [name, t] : held)
    if (t->defined() && t->device() != input.device())
      throw InvalidArgument(fmt::format("SyncBatchNorm got input on {} but its {} is on {}: move the layer to the "
                                        "input's device first (module->to(device)), as for BatchNorm",
                                        c10::str(input.device()), name, c10::str(t->device())));
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_) : options(std::move(options_)) { reset(); }

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, Tensors adopt)
    : options(std::move(options_)), adopt_(std::move(adopt)) {
  reset();
}

void SyncBatchNormImpl::reset() {
  const auto n = options.num_features();
  if (n <= 0) throw InvalidArgument(fmt::format("SyncBatchNorm: num_features must be positive, not {}", n));
  const auto adopted = [](Tensor& given, auto make) { return given.defined() ? std::exchange(given, Tensor()) : make(); };
  const bool affine = options.affine(), track = options.track_running_stats();
  weight = register_parameter(
      "weight", adopted(adopt_.weight, [&] { return affine ? ::torch::ones({n}) : Tensor(); }), affine);
  bias = register_parameter("bias", adopted(adopt_.bias, [&] { return affine ? ::torch::zeros({n}) : Tensor(); }),
                            affine);
  running_mean = register_buffer("running_mean",
                                 adopted(adopt_.running_mean, [&] { return track ? ::torch::zeros({n}) : Tensor(); }));
  running_var = register_buffer("running_var",
                                adopted(adopt_.running_var, [&] { return track ? ::torch::ones({n}) : Tensor(); }));
  num_batches_tracked = register_buffer("num_batches_tracked", adopted(adopt_.num_batches_tracked, [&] {
                                          return track ? ::torch::zeros({}, ::torch::kLong) : Tensor();
                                        }));
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  ::torch::NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "lockstep::torch::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum())
    stream << *options.momentum();
  else
    stream << "None";
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats()
         << ", ranks=" << (options.process_group() ? options.process_group()->size() : 1) << ")";
}

Tensor SyncBatchNormImpl::forward(const Tensor& input) {
  if (input.dim() < 2)
    throw InvalidArgument(fmt::format(
        "SyncBatchNorm expects input with a batch and a channel dimension, (N, C, ...), but got {} dimension(s); "
        "add the batch dimension (e.g. input.unsqueeze(0))",
        input.dim()));
  if (input.size(1) != options.num_features())
    throw InvalidArgument(fmt::format("SyncBatchNorm({}) got input with {} channels (dimension 1); build the layer "
                                      "with num_features = {}",
                                      options.num_features(), input.size(1), input.size(1)));
  check_same_device(input, *this);
  // As BatchNorm: the momentum, or a cumulative average when it is None.
  double momentum = 0;
  if (is_training() && options.track_running_stats()) {
    ::torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
    momentum = options.momentum() ? *options.momentum() : 1.0 / num_batches_tracked.item<double>();
  }
  const bool batch_stats = is_training() || !options.track_running_stats();
  auto* group = options.process_group().get();
  if (!is_training() || !group || group->size() == 1) {
    if (batch_stats && input.numel() / input.size(1) <= 1)
      throw InvalidArgument(fmt::format(
          "SyncBatchNorm: the batch has 1 value per channel (input {}); training needs more than 1",
          c10::str(input.sizes())));
    return ::torch::batch_norm(input, weight, bias, running_mean, running_var, batch_stats, momentum,
                               options.eps(), /*cudnn_enabled=*/false);
  }
  return SyncBatchNormFunction::apply(input, weight, bias, running_mean, running_var, options.eps(), momentum,
                                      group);
}

namespace {

bool is_batchnorm(const ::torch::nn::Module& m) {
  return dynamic_cast<const ::torch::nn::BatchNorm1dImpl*>(&m) ||
         dynamic_cast<const ::torch::nn::BatchNorm2dImpl*>(&m) || dynamic_cast<const ::torch::nn::BatchNorm3dImpl*>(&m);
}

// A SyncBatchNorm sharing the BatchNorm's options, parameters and buffers.
template <typename BatchNormImpl>
SyncBatchNorm from_batchnorm(const BatchNormImpl& bn, std::shared_ptr<ProcessGroup> group) {
  const auto& o = bn.options;
  return SyncBatchNorm(SyncBatchNormOptions(o.num_features())
                           .eps(o.eps())
                           .momentum(o.momentum())
                           .affine(o.affine())
                           .track_running_stats(o.track_running_stats())
                           .process_group(std::move(group)),
                       SyncBatchNormImpl::Tensors{bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                                  bn.num_batches_tracked});
}

// An empty holder when `m` is no BatchNorm.
SyncBatchNorm convert_batchnorm(const std::shared_ptr<::torch::nn::Module>& m,
                                const std::shared_ptr<ProcessGroup>& group) {
  if (auto bn = std::dynamic_pointer_cast<::torch::nn::BatchNorm1dImpl>(m)) return from_batchnorm(*bn, group);
  if (auto bn = std::dynamic_pointer_cast<::torch::nn::BatchNorm2dImpl>(m)) return from_batchnorm(*bn, group);
  if (auto bn = std::dynamic_pointer_cast<::torch::nn::BatchNorm3dImpl>(m)) return from_batchnorm(*bn, group);
  return SyncBatchNorm(nullptr);
}

// Gives `group` to the SyncBatchNorm layers under a custom module; throws
// for what cannot be replaced there.
void convert_inside(::torch::nn::Module& module, const std::string& path, const std::shared_ptr<ProcessGroup>& group) {
  for (const auto& item : module.named_children()) {
    const std::string& name = item.key();
    const auto& child = item.value();
    const std::string child_path = path.empty() ? name : path + "." + name;
    if (auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(child)) {
      sync->set_process_group(group);
    } else if (is_batchnorm(*child) || std::dynamic_pointer_cast<::torch::nn::SequentialImpl>(child)) {
      throw InvalidArgument(fmt::format(
          "convert_sync_batchnorm cannot replace '{}' ({}) inside {}: C++ cannot rebind that module's member. "
          "Declare the layer as lockstep::torch::SyncBatchNorm (without a group it is plain BatchNorm), or build "
          "the model as a torch::nn::Sequential",
          child_path, child->name(), module.name()));
    } else {
      convert_inside(*child, child_path, group);
    }
  }
}

}  // namespace

::torch::nn::Sequential convert_sync_batchnorm(const ::torch::nn::Sequential& module,
                                               std::shared_ptr<ProcessGroup> process_group) {
  ::torch::nn::Sequential converted;
  std::size_t index = 0;
  const auto names = module->named_children().keys();
  for (const auto& any : *module) {
    const std::string& name = names[index++];
    auto child = any.ptr();
    if (auto sync = convert_batchnorm(child, process_group)) {
      sync->train(child->is_training());
      converted->push_back(name, sync.ptr());
    } else {
      // (A Sequential cannot hold a Sequential directly; a subclass of one
      // is a custom module here.)
      if (auto s = std::dynamic_pointer_cast<SyncBatchNormImpl>(child))
        s->set_process_group(process_group);
      else
        convert_inside(*child, name, process_group);
      converted->push_back(name, any);
    }
  }
  converted->train(module->is_training());
  return converted;
}

std::shared_ptr<::torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<::torch::nn::Module> module,
                                                           std::shared_ptr<ProcessGroup> process_group) {
  if (!module) throw InvalidArgument("convert_sync_batchnorm: the module is null");
  if (auto sync = convert_batchnorm(module, process_group)) {
    sync->train(module->is_training());
    return sync.ptr();
  }
  if (auto seq = std::dynamic_pointer_cast<::torch::nn::SequentialImpl>(module))
    return convert_sync_batchnorm(::torch::nn::Sequential(seq), std::move(process_group)).ptr();
  if (auto s = std::dynamic_pointer_cast<SyncBatchNormImpl>(module)) {
    s->set_process_group(std::move(process_group));
    return module;
  }
  convert_inside(*module, "", process_group);
  return module;
}

}  // namespace lockstep::torch
