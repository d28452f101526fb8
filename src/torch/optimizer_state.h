// An optimizer's per-parameter state as tensors, for the optimizers
// libtorch ships (SGD, Adam, AdamW, Adagrad, RMSprop): what a
// ResilientTrainer digests and sends a replacement without serializing it.
// Free functions; as thread-safe as the optimizer they read or write.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
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

// A new state for a parameter of `optimizer` (one of libtorch's) holding
// `tensors` in state_tensors' order (undefined where it keeps none; three
// entries) and `step`: what state_tensors read, made again elsewhere.
// ConfigError for an optimizer libtorch does not ship.
std::unique_ptr<::torch::optim::OptimizerParamState> make_state_for(::torch::optim::Optimizer& optimizer,
                                                                    const std::vector<::torch::Tensor>& tensors,
                                                                    std::int64_t step);

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
// libtorch's optimizers only (ConfigError otherwise).
void broadcast_optimizer_state(ProcessGroup& group, ::torch::optim::Optimizer& optimizer, int root,
                               const std::vector<std::size_t>* only = nullptr);

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
