// The models the examples and benchmarks train. Header-only: each program
// includes what it uses.
//   MlpImpl      6 x Linear(2048, 2048) with ReLU (~25M parameters): a
//                communication-heavy workload
//   ConvNetImpl  the Fashion-MNIST / MNIST convnet: Conv 1->32->64 (3x3),
//                MaxPool 2, Linear 9216->128->10 (~1.2M parameters)
#pragma once

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

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)));
    fc1 = register_module("fc1", torch::nn::Linear(9216, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace examples
