// The options as numbers: the optimizer's kind (optimizer_kind.h), then
// each group's fields in a fixed order per kind (flags as 0 or 1), all as
// doubles, which hold every field exactly. For OptimizerKind::other, an
// archive of every group's options follows the kind instead.
#include "optimizer_options.h"

#include <cstdint>
#include <cstring>
#include <sstream>
#include <tuple>
#include <vector>

#include "common/enforce.h"
#include "optimizer_kind.h"

namespace lockstep::torch {
namespace {

namespace optim = ::torch::optim;

// Each of a group's options as a double, in a fixed order, through
// `visit(double&)`, then set from what the visit left: reading them
// leaves them as they were, loading them writes every one.
template <typename Visit>
void visit_sgd(optim::SGDOptions& o, Visit&& visit) {
  double nesterov = o.nesterov() ? 1 : 0;
  double lr = o.lr(), momentum = o.momentum(), dampening = o.dampening(), decay = o.weight_decay();
  visit(lr), visit(momentum), visit(dampening), visit(decay), visit(nesterov);
  o.lr(lr).momentum(momentum).dampening(dampening).weight_decay(decay).nesterov(nesterov != 0);
}

template <typename Options, typename Visit>
void visit_adam(Options& o, Visit&& visit) {
  double lr = o.lr(), beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas()), eps = o.eps();
  double decay = o.weight_decay(), amsgrad = o.amsgrad() ? 1 : 0;
  visit(lr), visit(beta1), visit(beta2), visit(eps), visit(decay), visit(amsgrad);
  o.lr(lr).betas(std::make_tuple(beta1, beta2)).eps(eps).weight_decay(decay).amsgrad(amsgrad != 0);
}

template <typename Visit>
void visit_adagrad(optim::AdagradOptions& o, Visit&& visit) {
  double lr = o.lr(), lr_decay = o.lr_decay(), decay = o.weight_decay();
  double initial = o.initial_accumulator_value(), eps = o.eps();
  visit(lr), visit(lr_decay), visit(decay), visit(initial), visit(eps);
  o.lr(lr).lr_decay(lr_decay).weight_decay(decay).initial_accumulator_value(initial).eps(eps);
}

template <typename Visit>
void visit_rmsprop(optim::RMSpropOptions& o, Visit&& visit) {
  double lr = o.lr(), alpha = o.alpha(), eps = o.eps(), decay = o.weight_decay(), momentum = o.momentum();
  double centered = o.centered() ? 1 : 0;
  visit(lr), visit(alpha), visit(eps), visit(decay), visit(momentum), visit(centered);
  o.lr(lr).alpha(alpha).eps(eps).weight_decay(decay).momentum(momentum).centered(centered != 0);
}


// Every field of group `options` of an optimizer of `kind` through `visit`.
template <typename Visit>
void visit_group(OptimizerKind kind, optim::OptimizerOptions& options, Visit&& visit) {
  switch (kind) {
    case OptimizerKind::sgd: return visit_sgd(static_cast<optim::SGDOptions&>(options), visit);
    case OptimizerKind::adam: return visit_adam(static_cast<optim::AdamOptions&>(options), visit);
    case OptimizerKind::adamw: return visit_adam(static_cast<optim::AdamWOptions&>(options), visit);
    case OptimizerKind::adagrad: return visit_adagrad(static_cast<optim::AdagradOptions&>(options), visit);
    case OptimizerKind::rmsprop: return visit_rmsprop(static_cast<optim::RMSpropOptions&>(options), visit);
    case OptimizerKind::other: break;
  }
}

std::string archive_of(optim::Optimizer& optimizer) {
  ::torch::serialize::OutputArchive archive;
  for (std::size_t i = 0; i < optimizer.param_groups().size(); ++i) {
    ::torch::serialize::OutputArchive group;
    optimizer.param_groups()[i].options().serialize(group);
    archive.write(std::to_string(i), group);
  }
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_archive(optim::Optimizer& optimizer, const char* bytes, std::size_t size) {
  ::torch::serialize::InputArchive archive;
  archive.load_from(bytes, size);
  for (std::size_t i = 0; i < optimizer.param_groups().size(); ++i) {
    ::torch::serialize::InputArchive group;
    archive.read(std::to_string(i), group);
    optimizer.param_groups()[i].options().serialize(group);
  }
}

}  // namespace

std::string options_bytes(optim::Optimizer& optimizer) {
  const OptimizerKind kind = kind_of(optimizer);
  std::string out(sizeof(OptimizerKind), '\0');
  std::memcpy(out.data(), &kind, sizeof kind);
  if (kind == OptimizerKind::other) return out + archive_of(optimizer);
  std::vector<double> fields;
  for (auto& group : optimizer.param_groups())
    visit_group(kind, group.options(), [&](double& field) { fields.push_back(field); });
  out.append(reinterpret_cast<const char*>(fields.data()), fields.size() * sizeof(double));
  return out;
}

void load_options(optim::Optimizer& optimizer, const std::string& bytes) {
  const OptimizerKind kind = kind_of(optimizer);
  OptimizerKind sent = OptimizerKind::other;
  LOCKSTEP_CHECK_ARG(bytes.size() >= sizeof sent, "load_options: {} bytes are no optimizer's options", bytes.size());
  std::memcpy(&sent, bytes.data(), sizeof sent);
  LOCKSTEP_CHECK_ARG(sent == kind,
                     "load_options: the options are of optimizer kind {}, this optimizer is of kind {} "
                     "(optimizer_kind.h)",
                     static_cast<std::int64_t>(sent), static_cast<std::int64_t>(kind));
  if (kind == OptimizerKind::other)
    return load_archive(optimizer, bytes.data() + sizeof sent, bytes.size() - sizeof sent);
  std::size_t per_group = 0;
  if (!optimizer.param_groups().empty())
    visit_group(kind, optimizer.param_groups().front().options(), [&](double&) { ++per_group; });
  const std::size_t count = (bytes.size() - sizeof sent) / sizeof(double);
  LOCKSTEP_CHECK_ARG(count == per_group * optimizer.param_groups().size() &&
                         (bytes.size() - sizeof sent) % sizeof(double) == 0,
                     "load_options: {} bytes of options for {} groups of {} numbers each", bytes.size() - sizeof sent,
                     optimizer.param_groups().size(), per_group);
  std::vector<double> fields(count);
  std::memcpy(fields.data(), bytes.data() + sizeof sent, count * sizeof(double));
  std::size_t next = 0;
  for (auto& group : optimizer.param_groups())
    visit_group(kind, group.options(), [&](double& field) { field = fields[next++]; });
}

}  // namespace lockstep::torch
