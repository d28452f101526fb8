// lockstep's fully_shard against PyTorch's FSDP2 itself:
// tests/tools/python/pytorch_fsdp.py trains an MLP of Linear+tanh blocks and
// a head (each block a unit, then the root, resharding after forward) in N
// gloo processes with FSDP2, from the same initial parameters on the same
// global batches, for SGD with momentum and for Adam; here N thread ranks
// do the same with fully_shard. No block's size is a multiple of 2 or 3, so
// both pad their shards (FSDP2 each parameter's rows, lockstep each unit's
// flat parameters). The final whole parameters agree within kRtol.
//
// The Python is the one whose PyTorch matches the libtorch built against
// (1.13: the system python3, which has no FSDP2, so the test skips there;
// 2.x: the project's .venv/torch2); without it the test skips too. A
// PyTorch run that hangs is run once more, then fails the test with its
// stacks (harness/reference_run.h): it never skips.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "harness/launcher.h"
#include "harness/reference_run.h"
#include "lockstep/torch/fully_shard.h"
#include "torch/fsdp_fixtures.h"
#include "torch/thread_ranks.h"

#ifndef LOCKSTEP_SYSTEM_PYTHON
#define LOCKSTEP_SYSTEM_PYTHON "/usr/bin/python3"
#endif
#ifndef LOCKSTEP_TORCH2_PYTHON
#define LOCKSTEP_TORCH2_PYTHON ""
#endif
#ifndef PYTORCH_FSDP
#define PYTORCH_FSDP ""
#endif

namespace lockstep::torch {
namespace {

namespace nn = ::torch::nn;
using ::torch::Tensor;
using testing::per_rank;
using testing::TorchThreadWorld;
using namespace std::chrono_literals;

// The Python script's model is fsdp_fixtures' (its widths, blocks and batch).
using fsdp_fixtures::borrow;
using fsdp_fixtures::kGlobalBatch;
using fsdp_fixtures::kOutputs;
using fsdp_fixtures::kWidths;
// The two sides run the same libtorch kernels on the same rows; what may
// differ is the order of the sums in the gradients' reduction (gloo's
// reduce-scatter and FSDP2's division by the world before it, against
// lockstep's average) and how each optimizer rounds its update (Python's
// Adam against libtorch's): roundings of float32 values that the steps
// carry along. Measured: SGD at 2 ranks bitwise equal, at 3 ranks 7.5e-9,
// Adam 3e-8 at both, on parameters of size 0.2 to 0.6 (a few units in the
// last place). The tolerance stands at least 30 times above that, so that other
// kernels (another CPU) cannot make it flaky, and far below what a
// difference in the training itself makes: a momentum of 0.89 instead of
// 0.9 moves the parameters by 2e-4, a gradient summed instead of averaged
// or a shard misplaced by about the learning rate.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-6;  // for parameters near zero
const auto kPythonDeadline = 120s;

std::string python_for_this_libtorch() {
  return TORCH_VERSION_MAJOR >= 2 ? LOCKSTEP_TORCH2_PYTHON : LOCKSTEP_SYSTEM_PYTHON;
}

// Raw little-endian float32, as the script writes (this host is little-endian).
std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The tensors `values` holds end to end, in the shapes of `like`.
std::vector<Tensor> split_like(const std::vector<float>& values, const std::vector<Tensor>& like) {
  std::vector<Tensor> out;
  std::size_t at = 0;
  for (const auto& t : like) {
    const auto n = static_cast<std::size_t>(t.numel());
    if (at + n > values.size()) throw std::runtime_error("too few values for the parameters");
    out.push_back(::torch::from_blob(const_cast<float*>(values.data() + at), t.sizes(), ::torch::kFloat).clone());
    at += n;
  }
  if (at != values.size()) throw std::runtime_error("more values than parameters");
  return out;
}

// fsdp_fixtures' model, with the script's initial parameters.
nn::Sequential plain_mlp(const std::vector<float>& init) {
  nn::Sequential net = fsdp_fixtures::plain_mlp();
  ::torch::NoGradGuard no_grad;
  const auto params = net->parameters();
  const auto values = split_like(init, params);
  for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(values[i]);
  return net;
}

// As the script shards: each block a unit, then the root (holding the
// head), resharding after forward.
std::shared_ptr<FullyShard<nn::SequentialImpl>> sharded(nn::Sequential plain, std::shared_ptr<ProcessGroup> pg) {
  return fsdp_fixtures::sharded_mlp(std::move(plain), std::move(pg), FullyShardOptions{});
}

struct Batch {
  Tensor x, y;
};
std::vector<Batch> read_batches(const std::string& path) {
  const std::vector<float> values = read_floats(path);
  const auto per_batch = static_cast<std::size_t>(kGlobalBatch * (kWidths.front() + kOutputs));
  std::vector<Batch> out;
  for (std::size_t at = 0; at + per_batch <= values.size(); at += per_batch) {
    auto* x = const_cast<float*>(values.data() + at);
    out.push_back({::torch::from_blob(x, {kGlobalBatch, kWidths.front()}, ::torch::kFloat).clone(),
                   ::torch::from_blob(x + kGlobalBatch * kWidths.front(), {kGlobalBatch, kOutputs}, ::torch::kFloat)
                       .clone()});
  }
  return out;
}

std::unique_ptr<::torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<Tensor> params) {
  if (kind == "adam") return std::make_unique<::torch::optim::Adam>(params, ::torch::optim::AdamOptions(0.01));
  return std::make_unique<::torch::optim::SGD>(params, ::torch::optim::SGDOptions(0.05).momentum(0.9));
}

using Case = std::tuple<int, std::string>;  // ranks, optimizer

class PyTorchFsdp : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string python = python_for_this_libtorch();
    if (python.empty() || ::access(python.c_str(), X_OK) != 0)
      GTEST_SKIP() << "no Python at '" << python << "' for libtorch " << TORCH_VERSION
                   << " (PyTorch 2.x comes from the project's .venv/torch2)";
    char name[] = "/tmp/lockstep-pytorch-fsdp-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
    const auto r = testing::run_reference(python, {PYTORCH_FSDP, dir_, std::to_string(ranks()), optimizer()},
                                          kPythonDeadline);
    if (r.exit_code == 3) GTEST_SKIP() << python << " cannot import torch.distributed: " << r.output;
    if (r.exit_code == 4)
      GTEST_SKIP() << "nothing to compare with: " << python << ": " << r.output;  // says which PyTorch lacks FSDP2
    ASSERT_EQ(r.exit_code, 0) << "PyTorch's side failed: " << testing::describe(r);
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  int ranks() const { return std::get<0>(GetParam()); }
  const std::string& optimizer() const { return std::get<1>(GetParam()); }

  // Trains with fully_shard at ranks() thread ranks; each rank's whole
  // parameters by name.
  std::vector<std::map<std::string, Tensor>> train() {
    const int ranks = this->ranks();
    const std::vector<float> init = read_floats(dir_ + "/init.bin");
    const auto batches = read_batches(dir_ + "/data.bin");
    auto plains = per_rank(ranks, [&](int) { return plain_mlp(init); });
    std::vector<std::map<std::string, Tensor>> out(static_cast<std::size_t>(ranks));
    TorchThreadWorld world(ranks, "shm");
    world.run([&](int rank, ProcessGroup& pg) {
      auto model = sharded(plains[static_cast<std::size_t>(rank)], borrow(pg));
      auto opt = make_optimizer(optimizer(), model->parameters());
      for (const auto& [x, y] : batches) {
        opt->zero_grad();
        ::torch::mse_loss(model->forward(x.chunk(ranks)[rank]), y.chunk(ranks)[rank]).backward();
        opt->step();
      }
      out[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
    });
    return out;
  }

  std::string dir_;
};

TEST_P(PyTorchFsdp, FinalParametersEqualFsdp2s) {
  const auto names = read_lines(dir_ + "/names.txt");
  const auto plain = plain_mlp(read_floats(dir_ + "/init.bin"));
  std::vector<std::string> model_names;
  for (const auto& item : plain->named_parameters()) model_names.push_back(item.key());
  ASSERT_EQ(names, model_names) << "the script's model is not this test's";
  const auto want =
      split_like(read_floats(fmt::format("{}/fsdp2_{}.bin", dir_, optimizer())), plain->parameters());
  const auto got = train();
  for (std::size_t r = 0; r < got.size(); ++r) {
    double worst = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
      ASSERT_TRUE(got[r].count(names[i])) << "rank " << r << ": no " << names[i] << " in full_state_dict";
      const Tensor g = got[r].at(names[i]).to(::torch::kDouble), w = want[i].to(::torch::kDouble);
      ASSERT_EQ(g.sizes(), w.sizes()) << names[i];
      const double diff = (g - w).abs().max().item<double>();
      worst = std::max(worst, diff);
      EXPECT_TRUE(::torch::allclose(g, w, kRtol, kAtol))
          << "rank " << r << ": " << names[i] << " differs from FSDP2's by " << diff << " (scale "
          << w.abs().max().item<double>() << ")";
    }
    std::cout << optimizer() << ", " << ranks() << " ranks, rank " << r << ": max |lockstep - FSDP2| = " << worst
              << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(RanksOptimizers, PyTorchFsdp,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values(std::string("sgd"), std::string("adam"))),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace lockstep::torch
