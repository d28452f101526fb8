// An optimizer's groups' options (the learning rate a scheduler set, the
// betas, the weight decay) as bytes, and back: what
// broadcast_optimizer_state sends beside the state, since libtorch 1.13's
// optimizers leave the options out of what they load from a checkpoint.
// libtorch's own optimizers' options go as their numbers; loading an
// archive costs about 12 ms (a serialized module's reader), which was
// most of a small replacement's feeding. Another optimizer's options go as
// an archive. Free functions; as thread-safe as the optimizer they read or
// write.
#pragma once

#include <torch/torch.h>

#include <string>

namespace lockstep::torch {

std::string options_bytes(::torch::optim::Optimizer& optimizer);

// Every group's options set from `bytes` (options_bytes of an optimizer
// of the same type with as many groups). InvalidArgument for bytes of
// another type or group count, before anything changes.
void load_options(::torch::optim::Optimizer& optimizer, const std::string& bytes);

}  // namespace lockstep::torch
