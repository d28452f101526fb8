// The models the examples, the benchmarks and `lockstep doctor`'s default
// workload train. Header-only, in the `lockstep_models` CMake target, so
// programs in any folder share them without reaching into another's.
//   MlpImpl      6 x Linear(2048, 2048) with ReLU (~25M parameters): a
//                communication-heavy workload
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
