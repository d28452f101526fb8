// The optimizer's state as tensors; see optimizer_state.h. The broadcast:
//   1. a header from the root: how the state goes (as tensors, or
//      serialized for an optimizer libtorch does not ship), the optimizer's
//      type, the sizes of what follows; every rank checks that its own
//      optimizer matches, and all refuse together where one does not;
//   2. the groups' options (optimizer_options.h: a few numbers each;
//      libtorch 1.13's optimizers leave them out of what they load from a
//      checkpoint);
//   then, for an optimizer libtorch does not ship, its serialized state;
//   else 3. a StateTable's entries: for each parameter in the groups'
//      order, which of its state tensors exist (or none yet) and its step;
//   4. the state tensors themselves, each rank's own (created for the
//      table's entries where it had none), by broadcast_coalesced.
#include "optimizer_state.h"

#include <fmt/format.h>

#include <optional>
#include <sstream>
#include <string>

#include "common/enforce.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "libtorch_version.h"
#include "optimizer_bytes.h"
#include "optimizer_kind.h"
#include "optimizer_options.h"
#include "receivers.h"

namespace lockstep::torch {
namespace {

namespace optim = ::torch::optim;

using Kind = OptimizerKind;
enum class Mode : std::int64_t { tensors = 0, serialized = 1 };

// Adam's and AdamW's states, alike but of two types.
template <typename State>
std::unique_ptr<optim::OptimizerParamState> adam_state(const std::vector<::torch::Tensor>& t, std::int64_t step) {
  auto s = std::make_unique<State>();
  s->exp_avg(t[0]);
  s->exp_avg_sq(t[1]);
  s->max_exp_avg_sq(t[2]);
  s->step(step);
  return s;
}

// A new state of `kind` holding `t` (in state_tensors' order) and `step`.
std::unique_ptr<optim::OptimizerParamState> make_state(Kind kind, const std::vector<::torch::Tensor>& t,
                                                       std::int64_t step) {
  switch (kind) {
    case Kind::sgd: {
      auto s = std::make_unique<optim::SGDParamState>();
      s->momentum_buffer(t[0]);
      return s;
    }
    case Kind::adam: return adam_state<optim::AdamParamState>(t, step);
    case Kind::adamw: return adam_state<optim::AdamWParamState>(t, step);
    case Kind::adagrad: {
      auto s = std::make_unique<optim::AdagradParamState>();
      s->sum(t[0]);
      s->step(step);
      return s;
    }
    case Kind::rmsprop: {
      auto s = std::make_unique<optim::RMSpropParamState>();
      s->square_avg(t[0]);
      s->momentum_buffer(t[1]);
      s->grad_avg(t[2]);
      s->step(step);
      return s;
    }
    case Kind::other: break;
  }
  throw Error("no state tensors for an optimizer libtorch does not ship");
}

bool shaped_like(const ::torch::Tensor& t, const ::torch::Tensor& param) {
  return t.is_contiguous() && t.sizes() == param.sizes() && t.scalar_type() == param.scalar_type() &&
         t.device() == param.device();
}

// Whether every state tensor has its parameter's shape, type, device and a
// contiguous layout, as a receiver creates it: else the state goes serialized.
bool shaped_like_params(optim::Optimizer& optimizer, const std::vector<::torch::Tensor>& params,
                        const std::vector<std::size_t>& indices) {
  for (std::size_t i : indices) {
    const auto& p = params[i];
    auto* state = state_of(optimizer, p);
    if (state == nullptr) continue;
    const auto known = state_tensors(*state);
    if (!known) return false;
    for (const auto& t : known->first)
      if (t.defined() && !shaped_like(t, p)) return false;
  }
  return true;
}

// Where the state goes: to every rank by broadcast, or from the root to
// some ranks alone by sends (the others hold it already and take no part
// past the agreement).
class Route {
 public:
  Route(ProcessGroup& group, int root, const std::vector<int>* receivers) : group_(group), root_(root) {
    if (receivers != nullptr) receivers_.emplace(group, root, *receivers, "broadcast_optimizer_state");
  }
  bool sending() const { return group_.rank() == root_; }
  bool receiving() const { return receivers_ ? receivers_->receiving(group_) : !sending(); }
  void move(Buffer b) const {
    if (!receivers_) {
      group_.broadcast(b, root_)->wait();
      return;
    }
    std::vector<std::shared_ptr<Work>> works;
    receivers_->issue(group_, b, kStateTag, works);
    wait_all(works);
  }
  void move_bytes(std::string& bytes, std::int64_t length) const {
    bytes.resize(static_cast<std::size_t>(length));
    if (length > 0) move(Buffer{bytes.data(), bytes.size(), DType::u8});
  }
  void move_tensors(const std::vector<::torch::Tensor>& tensors) const {
    if (!receivers_)
      broadcast_coalesced(group_, tensors, root_);
    else
      send_coalesced(group_, tensors, *receivers_);
  }

 private:
  static constexpr int kStateTag = 0x5c01;
  ProcessGroup& group_;
  int root_;
  std::optional<Receivers> receivers_;
};

}  // namespace

std::vector<std::size_t> all_indices(std::size_t n) {
  std::vector<std::size_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

std::vector<::torch::Tensor> params_of(const optim::Optimizer& optimizer) {
  std::vector<::torch::Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);
  return params;
}

bool is_libtorch_optimizer(optim::Optimizer& optimizer) { return kind_of(optimizer) != Kind::other; }

std::size_t state_bytes(const optim::Optimizer& optimizer, const std::vector<std::size_t>* only) {
  const std::vector<::torch::Tensor> params = params_of(optimizer);
  const auto& state = optimizer.state();
  std::size_t bytes = 0;
  for (std::size_t i : only != nullptr ? *only : all_indices(params.size())) {
    const auto it = state.find(libtorch::optimizer_state_key(params.at(i)));
    if (it == state.end()) continue;
    if (auto known = state_tensors(*it->second))
      for (const auto& t : known->first)
        if (t.defined()) bytes += t.nbytes();
  }
  return bytes;
}

std::optional<std::pair<std::vector<::torch::Tensor>, std::int64_t>> state_tensors(
    const optim::OptimizerParamState& state) {
  if (auto* s = dynamic_cast<const optim::SGDParamState*>(&state)) return {{{s->momentum_buffer()}, 0}};
  if (auto* s = dynamic_cast<const optim::AdamParamState*>(&state))
    return {{{s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()}, s->step()}};
  if (auto* s = dynamic_cast<const optim::AdamWParamState*>(&state))
    return {{{s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()}, s->step()}};
  if (auto* s = dynamic_cast<const optim::AdagradParamState*>(&state)) return {{{s->sum()}, s->step()}};
  if (auto* s = dynamic_cast<const optim::RMSpropParamState*>(&state))
    return {{{s->square_avg(), s->momentum_buffer(), s->grad_avg()}, s->step()}};
  return std::nullopt;
}

Kind libtorch_kind(optim::Optimizer& optimizer) {
  const Kind kind = kind_of(optimizer);
  if (kind == Kind::other)
    throw ConfigError("an optimizer's state as tensors needs one of libtorch's optimizers (SGD, Adam, AdamW, Adagrad, "
                      "RMSprop)");
  return kind;
}

StateTable state_table(optim::Optimizer& optimizer, const std::vector<::torch::Tensor>& params) {
  libtorch_kind(optimizer);
  StateTable table;
  table.entries.assign(2 * params.size(), StateTable::kNoState);
  for (std::size_t j = 0; j < params.size(); ++j) {
    const auto* state = state_of(optimizer, params[j]);
    if (state == nullptr) continue;
    const auto known = state_tensors(*state);
    std::int64_t mask = 0;
    for (std::size_t k = 0; k < known->first.size(); ++k)
      if (known->first[k].defined()) {
        mask |= std::int64_t{1} << k;
        table.tensors.push_back(known->first[k].contiguous());
      }
    table.entries[2 * j] = mask;
    table.entries[2 * j + 1] = known->second;
  }
  return table;
}

std::vector<::torch::Tensor> states_from_table(optim::Optimizer& optimizer, const std::vector<::torch::Tensor>& params,
                                               const std::vector<std::int64_t>& entries) {
  const Kind kind = libtorch_kind(optimizer);
  LOCKSTEP_CHECK_ARG(entries.size() == 2 * params.size(), "states_from_table: {} entries for {} parameters",
                     entries.size(), params.size());
  ::torch::NoGradGuard no_grad;
  auto& state = optimizer.state();
  std::vector<::torch::Tensor> to_fill;
  for (std::size_t j = 0; j < params.size(); ++j) {
    const auto& param = params[j];
    const auto key = libtorch::optimizer_state_key(param);
    const std::int64_t mask = entries[2 * j];
    if (mask == StateTable::kNoState) {
      state.erase(key);
      continue;
    }
    auto* held = state_of(optimizer, param);
    const auto current = held != nullptr ? state_tensors(*held) : std::nullopt;
    std::vector<::torch::Tensor> made(3);
    for (std::size_t k = 0; k < made.size(); ++k)
      if (mask & (std::int64_t{1} << k)) {
        const bool fits = current && k < current->first.size() && current->first[k].defined() &&
                          shaped_like(current->first[k], param);
        made[k] = fits ? current->first[k] : ::torch::empty(param.sizes(), param.options());
        to_fill.push_back(made[k]);
      }
    state[key] = make_state(kind, made, entries[2 * j + 1]);
  }
  return to_fill;
}

optim::OptimizerParamState* state_of(optim::Optimizer& optimizer, const ::torch::Tensor& param) {
  auto& state = optimizer.state();
  const auto it = state.find(libtorch::optimizer_state_key(param));
  return it == state.end() ? nullptr : it->second.get();
}

void broadcast_optimizer_state(ProcessGroup& group, optim::Optimizer& optimizer, int root,
                               const std::vector<std::size_t>* only, const std::vector<int>* receivers) {
  const Route route(group, root, receivers);
  const bool sending = route.sending();
  const std::vector<::torch::Tensor> params = params_of(optimizer);
  const Kind kind = kind_of(optimizer);
  const std::vector<std::size_t> indices = only != nullptr ? *only : all_indices(params.size());
  for (std::size_t i : indices) LOCKSTEP_CHECK_ARG(i < params.size(), "broadcast_optimizer_state: no parameter {}", i);
  const Mode mode =
      kind != Kind::other && shaped_like_params(optimizer, params, indices) ? Mode::tensors : Mode::serialized;
  if (only != nullptr && mode == Mode::serialized)
    throw ConfigError("broadcast_optimizer_state: the state of some parameters alone goes as tensors, which needs "
                      "one of libtorch's optimizers (SGD, Adam, AdamW, Adagrad, RMSprop) with state shaped like "
                      "its parameters");
  std::string options = sending ? options_bytes(optimizer) : std::string();
  std::string serialized_state = sending && mode == Mode::serialized ? serialized(optimizer) : std::string();

  // 1. The header, and every rank's agreement with it.
  std::int64_t header[5] = {static_cast<std::int64_t>(mode), static_cast<std::int64_t>(kind),
                            static_cast<std::int64_t>(params.size()), static_cast<std::int64_t>(options.size()),
                            static_cast<std::int64_t>(serialized_state.size())};
  route.move(Buffer{header, 5, DType::i64});  // a rank that receives nothing checks its own
  std::int64_t agrees = header[1] == static_cast<std::int64_t>(kind) &&
                                header[2] == static_cast<std::int64_t>(params.size())
                            ? 1
                            : 0;
  group.allreduce(Buffer{&agrees, 1, DType::i64}, ReduceOp::min)->wait();
  if (agrees == 0)
    throw ConfigError(fmt::format("broadcast_optimizer_state: the ranks' optimizers differ in type or in their number "
                                  "of parameters (this rank: {} parameters); every rank must build the same optimizer "
                                  "over the same model",
                                  params.size()));
  if (!sending && !route.receiving()) return;
  // 2. The options: libtorch 1.13's optimizers do not load them with
  // their serialized state.
  route.move_bytes(options, header[3]);
  if (!sending) load_options(optimizer, options);
  if (static_cast<Mode>(header[0]) == Mode::serialized) {
    route.move_bytes(serialized_state, header[4]);
    if (!sending) load_serialized(optimizer, serialized_state);
    return;
  }

  // 3. The table of which tensors each parameter has; 4. the tensors,
  // into states made for them on the receivers.
  std::vector<::torch::Tensor> selected;
  for (std::size_t i : indices) selected.push_back(params[i]);
  StateTable table;
  if (sending)
    table = state_table(optimizer, selected);
  else
    table.entries.assign(2 * selected.size(), StateTable::kNoState);
  if (!table.entries.empty()) route.move(Buffer{table.entries.data(), table.entries.size(), DType::i64});
  const std::vector<::torch::Tensor> tensors =
      sending ? table.tensors : states_from_table(optimizer, selected, table.entries);
  route.move_tensors(tensors);
}

}  // namespace lockstep::torch
