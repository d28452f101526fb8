// SyncBatchNorm: batch normalisation whose statistics come from the global
// batch (every rank's samples), as PyTorch's torch.nn.SyncBatchNorm.
//
//   auto net = torch::nn::Sequential(torch::nn::Conv2d(1, 8, 3), torch::nn::BatchNorm2d(8), torch::nn::ReLU());
//   net = lockstep::torch::convert_sync_batchnorm(net, pg);   // BatchNorm2d -> SyncBatchNorm
//   lockstep::torch::DistributedDataParallel ddp(net, pg);
//
// In training mode the forward all-reduces one small tensor per layer (the
// sample count, the per-channel sums and sums of squares) and normalises
// with the global mean and variance; the backward all-reduces the two
// per-channel sums the input gradient needs. The weight and bias gradients
// stay local (DistributedDataParallel averages them with the others).
// Running statistics are updated as PyTorch does (unbiased variance of the
// global batch), so they are equal on every rank. In eval mode, or without a
// process group (or with a group of one), it is exactly BatchNorm: local, no
// collective.
//
// Every rank of the group must run the layer's forward and backward the
// same number of times, in the same order relative to other collectives on
// that group (as for DDP); a rank may bring an empty batch.
//
// Thread-safety: like any torch::nn::Module, drive it from one thread.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "lockstep/process_group.h"

namespace lockstep::torch {

struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(std::int64_t num_features) : num_features_(num_features) {}
  TORCH_ARG(std::int64_t, num_features);
  TORCH_ARG(double, eps) = 1e-5;
  // None: a cumulative moving average (as BatchNorm's momentum=None).
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  TORCH_ARG(bool, affine) = true;
  TORCH_ARG(bool, track_running_stats) = true;
  // The ranks whose batches form the global batch (a sub-group from
  // ProcessGroup::new_group works too). Null: no synchronisation (BatchNorm).
  TORCH_ARG(std::shared_ptr<ProcessGroup>, process_group);
};

// Takes input of shape (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W):
// one class for BatchNorm1d, 2d and 3d. Parameter and buffer names are
// BatchNorm's (weight, bias, running_mean, running_var,
// num_batches_tracked), so state dicts and checkpoints carry over.
class SyncBatchNormImpl : public ::torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options);
  // A layer that holds the given tensors (a BatchNorm's weight, bias,
  // running_mean, running_var, num_batches_tracked; undefined where that
  // BatchNorm has none) instead of new ones: convert_sync_batchnorm's way
  // of sharing them.
  struct Tensors {
    ::torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  };
  SyncBatchNormImpl(SyncBatchNormOptions options, Tensors adopt);

  // Throws InvalidArgument for input without a batch dimension (fewer than
  // 2 dimensions) or with another channel count than num_features, and when
  // the global batch has a single value per channel in training.
  ::torch::Tensor forward(const ::torch::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void pretty_print(std::ostream& stream) const override;

  void set_process_group(std::shared_ptr<ProcessGroup> group) { options.process_group(std::move(group)); }

  SyncBatchNormOptions options;
  ::torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  Tensors adopt_;  // used by the first reset() only (a clone gets new tensors)
};
// The module holder, as TORCH_MODULE(SyncBatchNorm) would declare it
// (spelled out: inside lockstep::torch the macro's `torch::` would name
// this namespace).
class SyncBatchNorm : public ::torch::nn::ModuleHolder<SyncBatchNormImpl> {
 public:
  using ::torch::nn::ModuleHolder<SyncBatchNormImpl>::ModuleHolder;
  using Impl = SyncBatchNormImpl;
};

// Replaces BatchNorm1d/2d/3d by SyncBatchNorm layers over `process_group`
// (which the new layers share: the same weight, bias and running-statistics
// tensors, so an optimizer built before still updates them), and gives
// existing SyncBatchNorm layers that group. Returns the converted module:
//  - a BatchNorm module: a new SyncBatchNorm;
//  - a torch::nn::Sequential: a new Sequential holding the same layers but
//    SyncBatchNorm for each BatchNorm (the original keeps its layers);
//  - any other module: the same module, its SyncBatchNorm layers given the
//    group. C++ cannot rebind a module's typed members (a `BatchNorm2d bn1`
//    field keeps pointing to the old layer), so a BatchNorm or Sequential
//    found inside a custom module throws InvalidArgument naming it: declare
//    such layers as lockstep::torch::SyncBatchNorm (without a group it is
//    plain BatchNorm) and let this call switch them to the group.
std::shared_ptr<::torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<::torch::nn::Module> module,
                                                           std::shared_ptr<ProcessGroup> process_group);
::torch::nn::Sequential convert_sync_batchnorm(const ::torch::nn::Sequential& module,
                                               std::shared_ptr<ProcessGroup> process_group);

}  // namespace lockstep::torch
