// lockstep's Join({ddp, zero}) on uneven batches against PyTorch itself:
// tests/tools/python/pytorch_zero_join.py trains the same MLP from the same
// initial parameters on the same batches (rank 0: 5, rank 1: 3) in two gloo
// processes, with a StepLR scheduler, and here two lockstep rank processes
// do the same; the final parameters agree within 1e-6, for SGD with
// momentum and for Adam. The Python is the one whose PyTorch matches the
// libtorch built against (1.13: the system python3; 2.x: the project's
// .venv/torch2); without it, or without torch there, the tests skip. A
// PyTorch run that hangs is run once more, then fails the test with its
// stacks (harness/reference_run.h): it never skips.
//
// PyTorch's ZeroRedundancyOptimizer under Join steps a joined rank's shard
// on the gradients of that rank's last own iteration (PyTorch's DDP join
// hook all-reduces zeros and drops the result), while lockstep's steps it
// on the averages DDP's hook leaves, which is DDP with the unsharded
// optimizer: PyTorch's definition of training on uneven inputs. So
// lockstep is compared with PyTorch's Join([ddp]) and the unsharded
// optimizer, and, with the joined rank's last own gradients put back before
// the optimizer's hook, with PyTorch's Join([ddp, zero]).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "harness/launcher.h"
#include "harness/process_ranks.h"
#include "harness/reference_run.h"
#include "harness/reserved_port.h"
#include "lockstep/process_group.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/join.h"
#include "lockstep/torch/zero.h"

#ifndef LOCKSTEP_SYSTEM_PYTHON
#define LOCKSTEP_SYSTEM_PYTHON "/usr/bin/python3"
#endif
#ifndef LOCKSTEP_TORCH2_PYTHON
#define LOCKSTEP_TORCH2_PYTHON ""
#endif
#ifndef PYTORCH_ZERO_JOIN
#define PYTORCH_ZERO_JOIN ""
#endif

namespace lockstep::torch {
namespace {

namespace nn = ::torch::nn;
using ::torch::Tensor;
using namespace std::chrono_literals;

constexpr int kWorld = 2;
constexpr int kRows = 4;  // per batch, as in the Python script
constexpr int kCollectiveTimeoutS = 20;
// The Python script's StepLR.
constexpr unsigned kStepSize = 3;
constexpr double kGamma = 0.5;

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

void write_floats(const std::string& path, const std::vector<Tensor>& tensors) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& t : tensors) {
    const Tensor c = t.detach().contiguous();
    out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(c.numel() * 4));
  }
}

// Copies `values` into `tensors`, in order; throws unless the sizes agree.
void assign(const std::vector<Tensor>& tensors, const std::vector<float>& values) {
  ::torch::NoGradGuard no_grad;
  std::size_t at = 0;
  for (const auto& t : tensors) {
    const auto n = static_cast<std::size_t>(t.numel());
    if (at + n > values.size()) throw std::runtime_error("too few values for the parameters");
    t.copy_(::torch::from_blob(const_cast<float*>(values.data() + at), t.sizes(), ::torch::kFloat));
    at += n;
  }
  if (at != values.size()) throw std::runtime_error("more values than parameters");
}

nn::Sequential make_mlp(const std::vector<float>& init) {
  nn::Sequential net(nn::Linear(8, 16), nn::ReLU(), nn::Linear(16, 4));
  assign(net->parameters(), init);
  return net;
}

// Rank r's batches from data_rank<r>.bin: x (kRows x 8) then y (kRows x 4) each.
std::vector<std::pair<Tensor, Tensor>> read_batches(const std::string& path) {
  const std::vector<float> values = read_floats(path);
  constexpr std::size_t kPerBatch = kRows * (8 + 4);
  std::vector<std::pair<Tensor, Tensor>> out;
  for (std::size_t at = 0; at + kPerBatch <= values.size(); at += kPerBatch) {
    auto* x = const_cast<float*>(values.data() + at);
    out.emplace_back(::torch::from_blob(x, {kRows, 8}, ::torch::kFloat).clone(),
                     ::torch::from_blob(x + kRows * 8, {kRows, 4}, ::torch::kFloat).clone());
  }
  return out;
}

// Listed between ddp and zero: puts the gradients of this rank's last own
// iteration back after DDP's join hook, as PyTorch's ZeRO finds them.
class LastOwnGradients final : public Joinable {
 public:
  LastOwnGradients(std::vector<Tensor> params, ProcessGroup& group) : params_(std::move(params)), group_(group) {}
  // After the rank's last iteration, before it joins.
  void keep() {
    for (const auto& p : params_) kept_.push_back(p.grad().detach().clone());
  }
  std::unique_ptr<JoinHook> join_hook(const JoinOptions&) override { return std::make_unique<PutBack>(*this); }
  ProcessGroup& join_process_group() override { return group_; }

 private:
  struct PutBack final : JoinHook {
    explicit PutBack(LastOwnGradients& owner) : owner_(owner) {}
    void main_hook() override {
      for (std::size_t i = 0; i < owner_.params_.size(); ++i) owner_.params_[i].mutable_grad().copy_(owner_.kept_[i]);
    }
    LastOwnGradients& owner_;
  };
  std::vector<Tensor> params_;
  std::vector<Tensor> kept_;
  ProcessGroup& group_;
};

std::unique_ptr<ZeroRedundancyOptimizer> make_zero(const std::string& name, std::vector<Tensor> params,
                                                   std::shared_ptr<ProcessGroup> pg) {
  if (name == "sgd")
    return std::make_unique<ZeroRedundancyOptimizer>(std::move(params), std::move(pg),
                                                     ::torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<ZeroRedundancyOptimizer>(std::move(params), std::move(pg), ::torch::optim::AdamOptions(0.01));
}

// Trains one process per rank under Join({ddp, zero}) (with_last_own:
// Join({ddp, last own gradients, zero})); each writes its final parameters
// to <dir>/lockstep_rank<r>.bin.
void train_in_processes(const std::string& dir, const std::string& optimizer, bool with_last_own) {
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  testing::ProcessRanks ranks(
      kWorld,
      [&](int rank) { return testing::rank_env(rank, kWorld, port, "shm", kCollectiveTimeoutS); },
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = init_process_group();
        auto net = make_mlp(read_floats(dir + "/init.bin"));
        const auto batches = read_batches(fmt::format("{}/data_rank{}.bin", dir, rank));
        // JoinOptions' default divides by the initial world size, as
        // PyTorch's DDP join hook does by default.
        DistributedDataParallel ddp(net, pg);
        auto zero = make_zero(optimizer, net->parameters(), pg);
        ::torch::optim::StepLR sched(*zero, kStepSize, kGamma);
        // Python's scheduler steps once on construction; libtorch's does not.
        sched.step();
        LastOwnGradients last_own(net->parameters(), *pg);
        {
          std::vector<std::reference_wrapper<Joinable>> joinables{ddp};
          if (with_last_own) joinables.emplace_back(last_own);
          joinables.emplace_back(*zero);
          Join join(joinables);
          for (const auto& [x, y] : batches) {
            zero->zero_grad();
            ::torch::mse_loss(ddp.forward(x), y).backward();
            zero->step();
            sched.step();
          }
          if (with_last_own) last_own.keep();
          join.join();
        }
        write_floats(fmt::format("{}/lockstep_rank{}.bin", dir, rank), net->parameters());
      });
  for (const auto& r : ranks.wait_all(std::chrono::seconds(3 * kCollectiveTimeoutS))) {
    EXPECT_EQ(r.exit_code, testing::kExitOk) << testing::describe(r);
    EXPECT_FALSE(r.hit_deadline) << testing::describe(r);
  }
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double out = 0;
  for (std::size_t i = 0; i < a.size(); ++i) out = std::max(out, std::abs(static_cast<double>(a[i]) - b[i]));
  return out;
}

class PyTorchZeroJoin : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string python = python_for_this_libtorch();
    if (python.empty() || ::access(python.c_str(), X_OK) != 0)
      GTEST_SKIP() << "no Python at '" << python << "' for libtorch " << TORCH_VERSION
                   << " (PyTorch 2.x comes from the project's .venv/torch2)";
    char name[] = "/tmp/lockstep-pytorch-zero-join-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
    const auto r = testing::run_reference(python, {PYTORCH_ZERO_JOIN, dir_, GetParam()}, 90s);
    if (r.exit_code == 3) GTEST_SKIP() << python << " cannot import torch.distributed: " << r.output;
    ASSERT_EQ(r.exit_code, 0) << "PyTorch's side failed: " << testing::describe(r);
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }

  // Trains with lockstep; every rank's parameters against PyTorch's <file>.
  void expect_pytorch(const std::string& file, bool with_last_own) {
    train_in_processes(dir_, GetParam(), with_last_own);
    if (HasFailure()) return;  // a rank failed: its output is above
    const std::vector<float> expected = read_floats(dir_ + "/" + file);
    ASSERT_EQ(expected.size(), read_floats(dir_ + "/init.bin").size());
    for (int r = 0; r < kWorld; ++r) {
      const std::vector<float> got = read_floats(fmt::format("{}/lockstep_rank{}.bin", dir_, r));
      ASSERT_EQ(got.size(), expected.size()) << "rank " << r;
      const double diff = max_abs_difference(got, expected);
      std::cout << GetParam() << ", rank " << r << ": max |lockstep - PyTorch " << file << "| = " << diff << "\n";
      EXPECT_LE(diff, 1e-6) << "rank " << r << " differs from PyTorch's " << file << " by " << diff;
    }
  }

  std::string dir_;
};

TEST_P(PyTorchZeroJoin, EqualsPyTorchsDdpWithTheUnshardedOptimizer) {
  expect_pytorch(fmt::format("ddp_{}.bin", GetParam()), false);
  // For the record: how far PyTorch's own ZeRO is from that.
  if (!HasFailure())
    std::cout << "PyTorch's Join([ddp, zero]) differs from it by "
              << max_abs_difference(read_floats(fmt::format("{}/zero_{}.bin", dir_, GetParam())),
                                    read_floats(fmt::format("{}/ddp_{}.bin", dir_, GetParam())))
              << "\n";
}

TEST_P(PyTorchZeroJoin, WithTheLastOwnGradientsEqualsPyTorchsZero) {
  expect_pytorch(fmt::format("zero_{}.bin", GetParam()), true);
}

INSTANTIATE_TEST_SUITE_P(UnevenBatches, PyTorchZeroJoin, ::testing::Values("sgd", "adam"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep::torch
