// Each difference src/torch/libtorch_version.h papers over, checked against
// the libtorch this build uses (make test runs it on Debian's 1.13 and on
// PyTorch 2.x's): the optimizer state key finds the state a real optimizer
// stored, zero_grad does what the header says it does, and the standard
// library's calls reach libstdc++ even where libtorch exports copies.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "torch/libtorch_version.h"

namespace lockstep::torch {
namespace {

TEST(LibtorchVersion, NamesTheVersionTheHeadersDeclare) {
  EXPECT_EQ(libtorch::kMajor, TORCH_VERSION_MAJOR);
  EXPECT_GE(libtorch::kMajor, 1);
  if (libtorch::kMajor == 1) EXPECT_GE(libtorch::kMinor, 13);  // the oldest libtorch lockstep supports
}

TEST(LibtorchVersion, OptimizerStateKeyFindsTheStateOfEachParameterAndNoOther) {
  auto a = ::torch::ones({3}, ::torch::requires_grad());
  auto b = ::torch::ones({2, 2}, ::torch::requires_grad());
  auto stranger = ::torch::ones({3}, ::torch::requires_grad());
  ::torch::optim::Adam adam({a, b}, ::torch::optim::AdamOptions(0.1));
  (a.sum() * 2 + b.sum() * 3).backward();
  adam.step();
  ASSERT_EQ(adam.state().size(), 2u);
  for (const auto& [p, count] : {std::pair{a, 3}, std::pair{b, 4}}) {
    const auto it = adam.state().find(libtorch::optimizer_state_key(p));
    ASSERT_NE(it, adam.state().end());
    const auto* state = dynamic_cast<const ::torch::optim::AdamParamState*>(it->second.get());
    ASSERT_NE(state, nullptr);
    EXPECT_EQ(state->step(), 1);
    EXPECT_EQ(state->exp_avg().numel(), count);
  }
  EXPECT_EQ(adam.state().find(libtorch::optimizer_state_key(stranger)), adam.state().end());
  // The key is the parameter's identity, not its value: a copy is another key.
  EXPECT_EQ(adam.state().find(libtorch::optimizer_state_key(a.detach().clone())), adam.state().end());
}

TEST(LibtorchVersion, OptimizerStateKeyWritesStateTheOptimizerThenUses) {
  // What ZeroRedundancyOptimizer does when it moves state between
  // optimizers: an entry written under the key is the one step() reads.
  auto p = ::torch::zeros({4}, ::torch::requires_grad());
  ::torch::optim::SGD sgd({p}, ::torch::optim::SGDOptions(1.0).momentum(0.5));
  auto seeded = std::make_unique<::torch::optim::SGDParamState>();
  seeded->momentum_buffer(::torch::full({4}, 10.0));
  sgd.state()[libtorch::optimizer_state_key(p)] = std::move(seeded);
  p.sum().backward();  // gradient 1
  sgd.step();          // buffer 0.5 * 10 + 1 = 6; p = 0 - 6
  EXPECT_TRUE(::torch::allclose(p.detach(), ::torch::full({4}, -6.0)));
}

TEST(LibtorchVersion, ZeroGradDropsOrZeroesTheGradientsAsDeclared) {
  auto p = ::torch::ones({2}, ::torch::requires_grad());
  ::torch::optim::SGD sgd({p}, 0.1);
  p.sum().backward();
  ASSERT_TRUE(p.grad().defined());
  sgd.zero_grad();
  if (libtorch::kZeroGradDropsGradients) {
    EXPECT_FALSE(p.grad().defined());
  } else {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
}

// PyTorch 2.x's libtorch.so exports std::filesystem functions it linked
// statically; a program whose calls bind to them crashes (src/CMakeLists.txt
// says why, and what the link line does about it). This program links
// lockstep::torch like any user's, so it shows that the fix reaches them.
// DDP keeps each parameter's accumulator (a shared_ptr up to 2.11, an
// intrusive_ptr from 2.15) with its hook on it: the hook runs when the
// gradient is accumulated, and is gone once removed.
TEST(LibtorchVersion, GradAccumulatorHoldsTheAccumulatorWhoseHooksRunOnBackward) {
  auto p = ::torch::ones({3}, ::torch::requires_grad());
  libtorch::GradAccumulator accumulator = ::torch::autograd::impl::grad_accumulator(p);
  ASSERT_TRUE(accumulator);
  int calls = 0;
  const auto key = accumulator->add_post_hook(std::make_unique<::torch::autograd::utils::LambdaPostHook>(
      [&calls](const ::torch::autograd::variable_list& outputs, const ::torch::autograd::variable_list&) {
        ++calls;
        return outputs;
      }));
  (p * 2).sum().backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(accumulator->del_post_hook(key));
  (p * 2).sum().backward();
  EXPECT_EQ(calls, 1);
}

TEST(LibtorchVersion, StandardLibraryCallsReachLibstdcxxNotLibtorch) {
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&);
  const auto remove_all = static_cast<RemoveAll>(&std::filesystem::remove_all);
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(remove_all), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_NE(std::string(info.dli_fname).find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all comes from " << info.dli_fname;
  // And the call works: a small tree, removed.
  const auto root = std::filesystem::temp_directory_path() / ("lockstep_fs_" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "a" / "b");
  std::ofstream(root / "a" / "b" / "file") << "x";
  EXPECT_EQ(remove_all(root), 4u);
  EXPECT_FALSE(std::filesystem::exists(root));
}

}  // namespace
}  // namespace lockstep::torch
