// Which of libtorch's optimizers an optimizer is, for the code that reads
// or writes their state and options by type (optimizer_state.h,
// optimizer_options.h). The values travel between ranks: never renumber.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace lockstep::torch {

enum class OptimizerKind : std::int64_t { other = 0, sgd, adam, adamw, adagrad, rmsprop };

inline OptimizerKind kind_of(::torch::optim::Optimizer& o) {
  namespace optim = ::torch::optim;
  if (dynamic_cast<optim::SGD*>(&o) != nullptr) return OptimizerKind::sgd;
  if (dynamic_cast<optim::Adam*>(&o) != nullptr) return OptimizerKind::adam;
  if (dynamic_cast<optim::AdamW*>(&o) != nullptr) return OptimizerKind::adamw;
  if (dynamic_cast<optim::Adagrad*>(&o) != nullptr) return OptimizerKind::adagrad;
  if (dynamic_cast<optim::RMSprop*>(&o) != nullptr) return OptimizerKind::rmsprop;
  return OptimizerKind::other;
}

}  // namespace lockstep::torch
