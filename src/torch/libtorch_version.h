// The one place where lockstep's libtorch frontend meets the differences
// between the libtorch versions it is built against: Debian's 1.13 and
// PyTorch 2.x's. Everything else in src/torch is written once, for both.
// Header-only and stateless; thread-safe.
//
// What differs, and what each build sees here:
// - An optimizer's per-parameter state (`Optimizer::state()`) is keyed by
//   the parameter's TensorImpl: 1.13 by its address printed as a string
//   (made with c10::guts::to_string, which 2.x removed), 2.x by the
//   address itself (`void*`). `optimizer_state_key(p)` makes the key of
//   whichever map this libtorch has.
// - `Optimizer::zero_grad()` drops the gradients in 2.x (set_to_none
//   defaults to true) and zeroes them in 1.13: `kZeroGradDropsGradients`.
//   DDP handles both (docs/ddp.md); tests that depend on it say so.
// - A parameter's gradient accumulator (`autograd::impl::grad_accumulator`)
//   is a std::shared_ptr<Node> up to 2.11 and a c10::intrusive_ptr<Node>
//   from 2.15 on: `GradAccumulator` is whichever this libtorch returns.
// tests/torch/libtorch_version_test.cc checks each on both builds.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace lockstep::torch::libtorch {

constexpr int kMajor = TORCH_VERSION_MAJOR;
constexpr int kMinor = TORCH_VERSION_MINOR;

// The key type of Optimizer::state() in this libtorch.
using OptimizerStateKey =
    typename std::decay_t<decltype(std::declval<::torch::optim::Optimizer&>().state())>::key_type;

// The key under which an optimizer keeps the state of parameter `p`.
// A template so that only the branch for this libtorch's key is compiled.
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const ::torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    // What 1.13's c10::guts::to_string(impl) wrote: the address, streamed.
    std::ostringstream out;
    out << static_cast<const void*>(p.unsafeGetTensorImpl());
    return out.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// What autograd::impl::grad_accumulator returns in this libtorch, held by
// DDP for as long as its hook is on the accumulator.
using GradAccumulator =
    decltype(::torch::autograd::impl::grad_accumulator(std::declval<const ::torch::autograd::Variable&>()));

// Whether a plain `optimizer.zero_grad()` leaves undefined gradients (2.x)
// rather than zeros (1.13).
constexpr bool kZeroGradDropsGradients = kMajor >= 2;

}  // namespace lockstep::torch::libtorch
