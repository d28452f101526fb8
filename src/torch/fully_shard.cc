// fully_shard's wrapper module: what it takes over from the wrapped module
// (its names) and what FSDP2's FSDPModule offers on it.
#include "lockstep/torch/fully_shard.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <sstream>

#include "fsdp_unit.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/distributed.h"

namespace lockstep::torch {
namespace {

using ::torch::Tensor;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using NestedUnits = std::vector<std::pair<std::string, std::shared_ptr<detail::FsdpUnit>>>;

// The module's parameters that belong to no unit made inside it, and those
// units, with their paths. A parameter met twice (tied weights) counts once.
void collect_unit(::torch::nn::Module& module, const std::string& prefix, NamedTensors& params, NestedUnits& nested,
                  std::set<const c10::TensorImpl*>& seen) {
  for (const auto& item : module.named_parameters(/*recurse=*/false))
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) params.emplace_back(prefix + item.key(), item.value());
  for (const auto& child : module.named_children()) {
    if (auto* unit = dynamic_cast<FullyShardModule*>(child.value().get())) {
      nested.emplace_back(prefix + child.key(), unit->unit_ptr());
      for (const auto& p : unit->parameters()) seen.insert(p.unsafeGetTensorImpl());
    } else {
      collect_unit(*child.value(), prefix + child.key() + ".", params, nested, seen);
    }
  }
}

std::shared_ptr<detail::FsdpUnit> make_unit(::torch::nn::Module& inner, std::shared_ptr<ProcessGroup> group,
                                            FullyShardOptions options) {
  NamedTensors params;
  NestedUnits nested;
  std::set<const c10::TensorImpl*> seen;
  collect_unit(inner, "", params, nested, seen);
  // A replacement joining a running group is fed by its peers instead.
  if (options.sync_module_states && group && group->size() > 1 && !group->joined()) {
    std::vector<Tensor> buffers;
    for (const auto& b : inner.buffers()) buffers.push_back(b);
    if (!buffers.empty()) {
      ::torch::NoGradGuard no_grad;
      broadcast_coalesced(*group, buffers, 0);
    }
  }
  return std::make_shared<detail::FsdpUnit>(inner.name(), std::move(params), std::move(nested), std::move(group),
                                            std::move(options));
}

std::string shape_text(::torch::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

std::vector<detail::FsdpUnit*> units_of(FullyShardModule& model) { return model.unit().units_within(); }

}  // namespace

namespace detail {
Tensor cast_forward_input(FsdpUnit& unit, const Tensor& t) { return unit.cast_forward_input(t); }
void before_forward(FsdpUnit& unit) { unit.before_forward(); }
void after_forward(FsdpUnit& unit, const std::vector<Tensor>& outputs) { unit.after_forward(outputs); }
}  // namespace detail

FullyShardModule::FullyShardModule(const std::shared_ptr<::torch::nn::Module>& inner,
                                   std::shared_ptr<ProcessGroup> group, FullyShardOptions options)
    : ::torch::nn::Module("FullyShard<" + inner->name() + ">") {
  // The wrapper stands where the module stood, under the same names: its
  // parameters, buffers and children are the module's own.
  for (const auto& item : inner->named_parameters(/*recurse=*/false))
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  for (const auto& item : inner->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : inner->named_children()) register_module(item.key(), item.value());
  unit_ = make_unit(*inner, std::move(group), std::move(options));
}

FullyShardModule::~FullyShardModule() = default;

void FullyShardModule::set_requires_gradient_sync(bool sync) {
  for (detail::FsdpUnit* unit : units_of(*this)) unit->set_gradient_sync(sync);
}
void FullyShardModule::set_reshard_after_forward(bool reshard) {
  for (detail::FsdpUnit* unit : units_of(*this)) unit->options().reshard_after_forward = reshard;
}
void FullyShardModule::unshard() {
  for (detail::FsdpUnit* unit : units_of(*this)) unit->unshard();
}
void FullyShardModule::reshard() { unit_->reshard_outside_step(); }

ProcessGroup& FullyShardModule::group() const { return unit_->group(); }
const FullyShardOptions& FullyShardModule::options() const { return unit_->options(); }
std::int64_t FullyShardModule::unit_elements() const { return unit_->layout().data_elements(); }
std::int64_t FullyShardModule::shard_elements() const { return unit_->layout().shard_elements(); }

// ---- state dicts ------------------------------------------------------

std::map<std::string, Tensor> FullyShardModule::full_state_dict(int to) {
  ::torch::NoGradGuard no_grad;
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : named_parameters(/*recurse=*/true)) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::map<std::string, Tensor> state;
  ProcessGroup& pg = group();
  for (detail::FsdpUnit* unit : units_of(*this)) {
    const auto& layout = unit->layout();
    Tensor whole = ::torch::empty({layout.flat_elements()}, unit->shard().options());
    all_gather_into_tensor(pg, whole, unit->shard());
    if (pg.rank() != to) continue;
    for (std::size_t i = 0; i < unit->params().size(); ++i) {
      Tensor p = whole.narrow(0, layout.flat_offset(i), layout.numel(i)).view(unit->shapes()[i]).to(::torch::kCPU, true, true);
      state[names.at(unit->params()[i].unsafeGetTensorImpl())] = p;
    }
  }
  if (pg.rank() == to)
    for (const auto& item : named_buffers(/*recurse=*/true)) state[item.key()] = item.value().to(::torch::kCPU, true, true);
  return state;
}

void FullyShardModule::load_full_state_dict(const std::map<std::string, Tensor>& state) {
  ::torch::NoGradGuard no_grad;
  auto entry = [&](const std::string& name, ::torch::IntArrayRef shape) -> const Tensor& {
    const auto it = state.find(name);
    if (it == state.end())
      throw InvalidArgument(fmt::format("load_full_state_dict: the state has no entry '{}'", name));
    if (it->second.sizes() != shape)
      throw InvalidArgument(fmt::format("load_full_state_dict: '{}' has shape {}, the model's is {}", name,
                                        shape_text(it->second.sizes()), shape_text(shape)));
    return it->second;
  };
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : named_parameters(/*recurse=*/true)) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  const int rank = group().rank();
  for (detail::FsdpUnit* unit : units_of(*this)) {
    if (unit->step().in_step) throw InvalidArgument("load_full_state_dict during a step: load between steps");
    for (std::size_t i = 0; i < unit->params().size(); ++i) {
      const Tensor& whole = entry(names.at(unit->params()[i].unsafeGetTensorImpl()), unit->shapes()[i]);
      const ShardPiece piece = unit->layout().piece_of(rank, i);
      if (piece.count == 0) continue;
      unit->shard().narrow(0, piece.shard_offset, piece.count)
          .copy_(whole.reshape(-1).narrow(0, piece.param_offset, piece.count));
    }
  }
  for (const auto& item : named_buffers(/*recurse=*/true)) item.value().copy_(entry(item.key(), item.value().sizes()));
}

std::map<std::string, Tensor> FullyShardModule::sharded_state_dict() {
  std::map<std::string, Tensor> state;
  for (const auto& item : named_parameters(/*recurse=*/true)) state[item.key()] = item.value().detach().clone();
  for (const auto& item : named_buffers(/*recurse=*/true)) state[item.key()] = item.value().detach().clone();
  return state;
}

void FullyShardModule::load_sharded_state_dict(const std::map<std::string, Tensor>& state) {
  ::torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, const Tensor& into) {
    const auto it = state.find(name);
    if (it == state.end())
      throw InvalidArgument(fmt::format("load_sharded_state_dict: the state has no entry '{}'", name));
    if (it->second.sizes() != into.sizes())
      throw InvalidArgument(fmt::format(
          "load_sharded_state_dict: '{}' has {} elements here and {} in the state: a sharded state loads only at "
          "the world size it was saved at (use full_state_dict for another)",
          name, into.numel(), it->second.numel()));
    into.copy_(it->second);
  };
  for (const auto& item : named_parameters(/*recurse=*/true)) load(item.key(), item.value());
  for (const auto& item : named_buffers(/*recurse=*/true)) load(item.key(), item.value());
}

// ---- gradient clipping ------------------------------------------------

double clip_grad_norm_(FullyShardModule& model, double max_norm, double norm_type) {
  ::torch::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const auto& p : model.parameters())
    if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
  const bool infinity = std::isinf(norm_type);
  double local = 0;
  for (const auto& g : grads) {
    const double n = g.norm(norm_type).item<double>();
    local = infinity ? std::max(local, n) : local + std::pow(n, norm_type);
  }
  ProcessGroup& pg = model.group();
  if (pg.size() > 1) pg.allreduce(Buffer{&local, 1, DType::f64}, infinity ? ReduceOp::max : ReduceOp::sum)->wait();
  const double total = infinity ? local : std::pow(local, 1.0 / norm_type);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1)
    for (auto& g : grads) g.mul_(coefficient);
  return total;
}

}  // namespace lockstep::torch
