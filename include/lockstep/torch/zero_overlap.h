// hook_with_zero_step: PyTorch's ddp_zero_hook (torch.distributed.
// algorithms.ddp_comm_hooks.ddp_zero_hook). It wraps a DDP comm hook so
// that each rank steps its shard of a ZeroRedundancyOptimizer built with
// ZeroOptions::overlap_with_ddp bucket by bucket, as DDP's reductions
// complete, instead of in zero.step():
//
//   lockstep::torch::DistributedDataParallel ddp(net, pg);
//   lockstep::torch::ZeroRedundancyOptimizer zero(net->parameters(), pg, torch::optim::AdamOptions(1e-3),
//                                                 {.overlap_with_ddp = true});
//   ddp.register_comm_hook(lockstep::torch::hook_with_zero_step(lockstep::torch::allreduce_hook(), ddp, zero));
//   ...  zero.zero_grad(); loss.backward(); zero.step();   // step() only all-gathers the shards
//
// What overlaps: the optimizer's arithmetic with backward (interleaved) or
// with the reductions still in flight after backward (hook_with_zero_step).
// The all-gather of the updated shards stays in zero.step(), after
// backward: collectives issued from a hook's continuation would reach the
// group in a different order on each rank, interleaved with DDP's own.
// docs/torch.md says more.
//
// Thread-safety: the hook steps the shard on the thread that completes a
// bucket's reduction (the group's progress thread, or the backward thread),
// one bucket at a time, touching only that bucket's parameters, whose
// gradients are final. Nothing else may use the optimizer during backward.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/reducer.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/zero.h"

namespace lockstep::torch {

// When the shard's step of each bucket runs.
enum class ZeroStepSchedule {
  // Once backward has launched its last bucket: each bucket's step in turn,
  // in bucket order, after its reduction (PyTorch's hook_with_zero_step).
  // The optimizer does not compete with backward's own computation.
  after_backward,
  // As each bucket's reduction completes, while backward goes on
  // (PyTorch's hook_with_zero_step_interleaved).
  interleaved,
};

// `hook` reduces each bucket (allreduce_hook(), fp16_compress_hook(), ...);
// the result then steps the parameters of that bucket that `zero` assigns
// to this rank. Register it with ddp.register_comm_hook(...). Throws
// InvalidArgument if `zero` was built without overlap_with_ddp, with the
// balanced_elements partition, already has such a hook, or holds a
// parameter that the DDP module does not reduce. `zero` must outlive DDP's
// use of the hook. Host memory only (the Reducer refuses it on CUDA).
//
// `ddp_params` are the DDP module's named parameters (named_parameters(),
// recursively); the template below passes them.
std::shared_ptr<CommHook> hook_with_zero_step(std::shared_ptr<CommHook> hook,
                                              const std::vector<std::pair<std::string, ::torch::Tensor>>& ddp_params,
                                              ZeroRedundancyOptimizer& zero,
                                              ZeroStepSchedule schedule = ZeroStepSchedule::after_backward);

template <typename ModuleImpl>
std::shared_ptr<CommHook> hook_with_zero_step(std::shared_ptr<CommHook> hook, DistributedDataParallel<ModuleImpl>& ddp,
                                              ZeroRedundancyOptimizer& zero) {
  std::vector<std::pair<std::string, ::torch::Tensor>> named;
  for (const auto& item : ddp.module().named_parameters(/*recurse=*/true)) named.emplace_back(item.key(), item.value());
  return hook_with_zero_step(std::move(hook), named, zero, ZeroStepSchedule::after_backward);
}

template <typename ModuleImpl>
std::shared_ptr<CommHook> hook_with_zero_step_interleaved(std::shared_ptr<CommHook> hook,
                                                          DistributedDataParallel<ModuleImpl>& ddp,
                                                          ZeroRedundancyOptimizer& zero) {
  std::vector<std::pair<std::string, ::torch::Tensor>> named;
  for (const auto& item : ddp.module().named_parameters(/*recurse=*/true)) named.emplace_back(item.key(), item.value());
  return hook_with_zero_step(std::move(hook), named, zero, ZeroStepSchedule::interleaved);
}

}  // namespace lockstep::torch
