// The models the examples, the benchmarks and `lockstep doctor`'s default
// workload train. Header-only, in the `lockstep_models` CMake target, so
// programs in any folder share them without reaching into another's.
//   MlpImpl      6 x Linear(2048, 2048) with ReLU (~25M parameters): a
//                communication-heavy workload
//   WideMlpImpl  6 x Linear(4096, 4096) with ReLU (~101M parameters): the
//                GPU workload, a step of tens of milliseconds at a batch of
//                thousands
//   DeepMlpImpl  8 x Linear(1024, 1024) with ReLU (~8.4M parameters): the
//                fully sharded benchmarks' model, one unit per layer
//   ConvNetImpl  the Fashion-MNIST / MNIST convnet: Conv 1->32->64 (3x3),
//                MaxPool 2, Linear 9216->128->10 (~1.2M parameters);
//                optionally with batch normalisation after each conv
#pragma once

#include <lockstep/torch/sync_batchnorm.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace examples {

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int layers = 6, int width = 2048) {
    for (int i = 0; i < layers; ++i)
      fc.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, width)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t i = 0; i < fc.size(); ++i) {
      x = fc[i](x);
      if (i + 1 < fc.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> fc;
};

// The GPU benchmarks' model (examples/ddp_throughput --model wide-mlp,
// bench/compare_gpu_ddp.py). An MLP rather than a ResNet-like convnet: its
// step is six large matrix products per pass, whose time on a GPU varies
// little from run to run (no cuDNN algorithm choice, no data-dependent
// kernels), which a benchmark that must resolve a few percent needs; its
// layers are trivially the same in libtorch and in PyTorch; and the batch
// alone sets the compute per step (6 x parameters x batch flops), so one
// model serves any card. 101M parameters (403 MB of fp32 gradients, 16
// buckets at the default 25 MB cap) give DDP's per-bucket work its real
// size.
struct WideMlpImpl : MlpImpl {
  static constexpr int kLayers = 6;
  static constexpr int kWidth = 4096;
  WideMlpImpl() : MlpImpl(kLayers, kWidth) {}
};

// The fully sharded benchmarks' model (examples/ddp_throughput --fsdp,
// bench/compare_fsdp.py): more and smaller layers than MlpImpl, each a
// sharding unit of 4 MiB, so that at its default batch of 32 per rank a
// CPU step's compute (1.6 Gflop) and its collectives (8 all-gathers for
// forward, 7 for backward, 8 reduce-scatters) take times of one order.
struct DeepMlpImpl : MlpImpl {
  static constexpr int kLayers = 8;
  static constexpr int kWidth = 1024;
  DeepMlpImpl() : MlpImpl(kLayers, kWidth) {}
};

// With batch_norm, a normalisation layer follows each conv. It is declared
// as lockstep's SyncBatchNorm, which is plain BatchNorm (statistics of this
// rank's batch) until lockstep::torch::convert_sync_batchnorm(model, pg)
// gives it a group (statistics of the global batch).
struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(bool batch_norm = false) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
    if (batch_norm) {
      bn1 = register_module("bn1", lockstep::torch::SyncBatchNorm(32));
      bn2 = register_module("bn2", lockstep::torch::SyncBatchNorm(64));
    }
    fc1 = register_module("fc1", torch::nn::Linear(9216, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = conv1(x);
    x = torch::relu(bn1 ? bn1(x) : x);
    x = conv2(x);
    x = torch::max_pool2d(torch::relu(bn2 ? bn2(x) : x), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  lockstep::torch::SyncBatchNorm bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace examples
