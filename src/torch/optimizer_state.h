// An optimizer's per-parameter state as tensors, for the optimizers
// libtorch ships (SGD, Adam, AdamW, Adagrad, RMSprop): what a
// ResilientTrainer digests and sends a replacement without serializing it.
// Free functions; as thread-safe as the optimizer they read or write.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::torch {

// A parameter's state: its tensors in a fixed order (undefined where the
// optimizer keeps none: SGD without momentum, Adam without amsgrad) and
// its step count (0 for SGD). nullopt for an optimizer libtorch does not ship.
std::optional<std::pair<std::vector<::torch::Tensor>, std::int64_t>> state_tensors(
    const ::torch::optim::OptimizerParamState& state);

// The state of some parameters as it travels as tensors: per parameter a
// mask of the state tensors it has (bit k: state_tensors' k-th; kNoState:
// no state yet) and its step count, then the tensors the masks name, in
// order, each contiguous.
struct StateTable {
  static constexpr std::int64_t kNoState = -1;
  std::vector<std::int64_t> entries;  // two per parameter: mask, step
  std::vector<::torch::Tensor> tensors;
};

// The table of `params`' state in `optimizer`, one of libtorch's
// (is_libtorch_optimizer; ConfigError otherwise).
StateTable state_table(::torch::optim::Optimizer& optimizer, const std::vector<::torch::Tensor>& params);

// The other end: `params`' state in `optimizer` made as `entries` (a
// state_table's, for these parameters) says, erased where it says none.
// Returns the tensors to fill, in the table's order: those the state holds
// where they fit (a survivor's, memory already touched), new ones where
// not. ConfigError for an optimizer libtorch does not ship.
std::vector<::torch::Tensor> states_from_table(::torch::optim::Optimizer& optimizer,
                                               const std::vector<::torch::Tensor>& params,
                                               const std::vector<std::int64_t>& entries);

// The state of `param` in `optimizer`, or nullptr where it has none yet.
::torch::optim::OptimizerParamState* state_of(::torch::optim::Optimizer& optimizer, const ::torch::Tensor& param);

// The optimizer's state and its groups' options (the learning rate a
// scheduler set, for instance) from `root` to every rank of `group`,
// replacing what the others hold. libtorch's optimizers' state tensors go
// by broadcast, each in its own memory, with the options and a table of
// which tensors each parameter has; another optimizer's state goes
// serialized, as a checkpoint holds it, with the options beside it (what
// libtorch 1.13's load leaves as it was). Collective; every rank's optimizer
// must be of the same type over parameters of the same shapes (the same
// program), or it throws. With `only`, the state of those parameters alone
// (indices in the groups' order) goes, and the others' is left as it is;
// libtorch's optimizers only (ConfigError otherwise). With `receivers`
// (group ranks), only they get it, by sends from `root` (send_coalesced);
// the others, which hold it already, only join the check of the types.
void broadcast_optimizer_state(ProcessGroup& group, ::torch::optim::Optimizer& optimizer, int root,
                               const std::vector<std::size_t>* only = nullptr,
                               const std::vector<int>* receivers = nullptr);

// Whether the optimizer is one libtorch ships, whose state state_tensors reads.
bool is_libtorch_optimizer(::torch::optim::Optimizer& optimizer);

// The bytes of state tensors the optimizer holds for its parameters, or
// for those `only` lists (libtorch's optimizers'; 0 for another's).
std::size_t state_bytes(const ::torch::optim::Optimizer& optimizer, const std::vector<std::size_t>* only = nullptr);

// The optimizer's parameters, in its groups' order.
std::vector<::torch::Tensor> params_of(const ::torch::optim::Optimizer& optimizer);

// 0, 1, ..., n - 1: every parameter's index, where `only` is not given.
std::vector<std::size_t> all_indices(std::size_t n);

}  // namespace lockstep::torch
