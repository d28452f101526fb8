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
    ::torch::optim::OptimizerParamState& state);

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
// program), or it throws.
void broadcast_optimizer_state(ProcessGroup& group, ::torch::optim::Optimizer& optimizer, int root);

}  // namespace lockstep::torch
