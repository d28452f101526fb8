// libtorch's Adam step in one pass over memory, for a copy that must hold
// its owner's bits (ShardBackup's copy of a neighbour's shard). libtorch
// 1.13 steps a parameter in eight elementwise operations, each a pass over
// parameter, gradient or state; this one reads each element once and does
// the same arithmetic, in the same order, with the same roundings (two
// fused multiply-adds where libtorch's kernels fuse them), so the bits are
// the same where fused_adam_matches says so: it compares them on the
// machine and libtorch at hand, since a libtorch whose Adam computes in
// another order (2.x's does) gives other bits, and then the caller keeps
// libtorch's own step.
// Free functions; as thread-safe as the tensors they are given.
#pragma once

#include <torch/torch.h>

namespace lockstep::torch::detail {

// Whether fused_adam_step gives libtorch's bits here: a few steps of both
// over probes of several lengths (vector bodies and scalar tails) and
// values (zeros, large and tiny gradients), compared element by element.
// Touches no random generator. Call once and keep the answer.
bool fused_adam_matches();

// Whether fused_adam_step can step `optimizer` now: on a CPU with AVX2 and
// FMA, a libtorch Adam without weight decay or amsgrad, every parameter
// with a gradient has state (its first step, which makes the state, is
// libtorch's), and each parameter, gradient and state tensor is a
// contiguous float tensor on the CPU.
bool fused_adam_applies(::torch::optim::Optimizer& optimizer);

// One step of `optimizer` (fused_adam_applies must hold): as its step()
// would, parameter by parameter, counting each stepped parameter's step.
void fused_adam_step(::torch::optim::Optimizer& optimizer);

}  // namespace lockstep::torch::detail
