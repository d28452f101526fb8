// What the ZeroRedundancyOptimizer tests share: an MLP with parameters of
// uneven sizes (so shards differ in size and count), the global batches
// every test trains on, and the two optimizers they shard.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/zero.h"

namespace lockstep::torch::zero_fixtures {

namespace nn = ::torch::nn;
using ::torch::Tensor;

// A group the test's ThreadWorld owns, as the shared_ptr the wrappers take.
inline std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

inline nn::Sequential make_mlp(int seed) {
  ::torch::manual_seed(seed);
  return nn::Sequential(nn::Linear(8, 32), nn::ReLU(), nn::Linear(32, 24), nn::Tanh(), nn::Linear(24, 16), nn::ReLU(),
                        nn::Linear(16, 4));
}

constexpr int kGlobalBatch = 24;
constexpr int kMostSteps = 8;  // batches drawn; a test trains on the first few

// The global batch of `step`, all drawn once on the first caller's thread
// (the reference's, before any rank runs): libtorch's default generator is
// one per process, and rank threads seeding and drawing from it at once
// would get each other's numbers.
inline std::pair<Tensor, Tensor> batch(int step) {
  static const std::vector<std::pair<Tensor, Tensor>> batches = [] {
    std::vector<std::pair<Tensor, Tensor>> out;
    for (int s = 0; s < kMostSteps; ++s) {
      ::torch::manual_seed(100 + s);
      auto x = ::torch::randn({kGlobalBatch, 8});
      out.emplace_back(x, ::torch::randn({kGlobalBatch, 4}));
    }
    return out;
  }();
  return batches.at(static_cast<std::size_t>(step));
}

using Factory = ZeroRedundancyOptimizer::OptimizerFactory;

inline Factory sgd() {
  return [](std::vector<Tensor> p) {
    return std::make_unique<::torch::optim::SGD>(std::move(p), ::torch::optim::SGDOptions(0.05).momentum(0.9));
  };
}
inline Factory adam() {
  return [](std::vector<Tensor> p) {
    return std::make_unique<::torch::optim::Adam>(std::move(p), ::torch::optim::AdamOptions(0.01));
  };
}

}  // namespace lockstep::torch::zero_fixtures
