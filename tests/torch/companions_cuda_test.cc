// DDP's companions on CUDA tensors (label gpu): SyncBatchNorm,
// ZeroRedundancyOptimizer and the PowerSGD hooks trained on cuda:0 in a
// world of one and by 2 rank processes sharing the GPU over shm, each
// against the same training on the CPU (thread ranks over shm), and the
// first two against one process training on the whole global batch on the
// CPU (plain BatchNorm; the unsharded Adam, whose state the consolidated
// one must equal). The ranks are processes, and the parent
// never touches CUDA before forking them (a forked child cannot use a CUDA
// its parent started): see ddp_cuda_test.cc, whose harness this follows.
//
// Compiled against any libtorch, so it cannot rot where there is no GPU;
// every test skips unless libtorch sees a CUDA device.
//
// Tolerance: relative 1e-4, absolute 1e-5 (fp32, TF32 off: the GPU differs
// from the CPU only in the order of its sums).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "harness/process_ranks.h"
#include "torch/gpu_ranks.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"
#include "lockstep/powersgd.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/sync_batchnorm.h"
#include "lockstep/torch/zero.h"
#include "torch/libtorch_version.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::ThreadWorld;
using lockstep::testing::TempDir;
using lockstep::testing::exact_fp32;
using ::torch::Tensor;
namespace nn = ::torch::nn;


constexpr double kRtol = 1e-4;
constexpr int kGlobalBatch = 16;
constexpr int kSteps = 3;

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

using Batches = std::vector<std::pair<Tensor, Tensor>>;

// Drawn once, before any rank runs, from a CPU generator of its own: the
// parent must not touch CUDA before it forks the ranks, and
// ::torch::manual_seed seeds every CUDA device's generator too, which
// initializes CUDA (each rank then failed with "CUDA error: initialization
// error").
Tensor draw(at::Generator& gen, std::vector<std::int64_t> shape) { return ::torch::randn(shape, gen); }

Batches draw_batches(int steps, std::uint64_t seed, std::vector<std::int64_t> input_shape, std::int64_t outputs) {
  Batches out;
  input_shape.insert(input_shape.begin(), kGlobalBatch);
  for (int step = 0; step < steps; ++step) {
    auto gen = at::detail::createCPUGenerator(seed + static_cast<std::uint64_t>(step));
    auto x = draw(gen, input_shape);
    out.emplace_back(x, draw(gen, {kGlobalBatch, outputs}));
  }
  return out;
}

Batches make_batches(std::vector<std::int64_t> input_shape, std::int64_t outputs) {
  return draw_batches(kSteps, 1000, std::move(input_shape), outputs);
}

std::vector<Tensor> to_cpu(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().to(::torch::kCPU).clone());
  return out;
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto g = got[i].to(::torch::kDouble), w = want[i].to(::torch::kDouble);
    EXPECT_TRUE(::torch::allclose(g, w, kRtol, kRtol * 0.1))
        << what << ": tensor " << i << " differs by " << (g - w).abs().max().item<double>() << " (scale "
        << w.abs().max().item<double>() << ")";
  }
}

// Runs body(rank, group) on the CPU in `n` thread ranks over shm.
void run_on_cpu(int n, const std::function<void(int rank, ProcessGroup& pg)>& body) {
  at::set_num_threads(1);
  ThreadWorld world(n, "shm");
  world.run(body);
}

// ---- SyncBatchNorm -------------------------------------------------------

nn::Sequential make_convnet() {
  ::torch::manual_seed(7);
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(2, 4, 3)), nn::BatchNorm2d(4), nn::ReLU(), nn::Flatten(),
                        nn::Linear(4 * 4 * 4, 3));
}

// The parameters, the running statistics, and the first step's gradient of
// the rank's input (the backward's all-reduce at work), on the CPU.
std::vector<Tensor> sync_batchnorm_result(nn::Sequential& net, const Tensor& first_input_grad) {
  std::vector<Tensor> out = to_cpu(net->parameters());
  for (const auto& b : to_cpu(net->buffers())) out.push_back(b);
  out.push_back(first_input_grad.to(::torch::kCPU));
  return out;
}

// One rank: its shard of each global batch, through SyncBatchNorm and DDP.
std::vector<Tensor> train_sync_batchnorm(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches) {
  const int n = pg.size();
  auto net = convert_sync_batchnorm(make_convnet(), borrow(pg));
  net->to(device);
  DistributedDataParallel ddp(net, borrow(pg));
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  Tensor first_input_grad;
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    auto xs = x.chunk(n)[rank].to(device).clone().requires_grad_(true);
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(xs), y.chunk(n)[rank].to(device)).backward();
    if (step == 0) first_input_grad = xs.grad().detach().clone();
    opt.step();
  }
  return sync_batchnorm_result(net, first_input_grad);
}

// One process, plain BatchNorm over the whole global batch. The input's
// gradient is rank 0's part of the global one, times the ranks (each
// rank's loss is the mean over its shard only).
std::vector<Tensor> sync_batchnorm_reference(int n, const Batches& batches) {
  auto net = make_convnet();
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  Tensor first_input_grad;
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    auto xg = x.clone().requires_grad_(true);
    opt.zero_grad();
    ::torch::mse_loss(net->forward(xg), y).backward();
    if (step == 0) first_input_grad = xg.grad().chunk(n)[0] * n;
    opt.step();
  }
  return sync_batchnorm_result(net, first_input_grad);
}

class SyncBatchNormOnCuda : public ::testing::TestWithParam<int> {};

TEST_P(SyncBatchNormOnCuda, TrainsAsOnTheCpuAndAsBatchNormOverTheGlobalBatch) {
  SKIP_WITHOUT_GPU_DEVICE();
  const int n = GetParam();
  const Batches batches = make_batches({2, 6, 6}, 3);
  const TempDir dir;
  const std::string result = dir.path() + "/sync_batchnorm.pt";
  std::string why;
  const bool ran = testing::run_on_gpu(
      n, "shm", dir.path(),
      [&](int rank, ProcessGroup& pg) {
        auto state = train_sync_batchnorm(rank, pg, ::torch::Device(::torch::kCUDA, 0), batches);
        if (rank == 0) ::torch::save(state, result);
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<Tensor> on_gpu;
  ::torch::load(on_gpu, result);
  std::vector<Tensor> on_cpu;
  run_on_cpu(n, [&](int rank, ProcessGroup& pg) {
    auto state = train_sync_batchnorm(rank, pg, ::torch::Device(::torch::kCPU), batches);
    if (rank == 0) on_cpu = std::move(state);
  });
  expect_close(on_gpu, on_cpu, "SyncBatchNorm on cuda:0 against SyncBatchNorm on the CPU");
  expect_close(on_gpu, sync_batchnorm_reference(n, batches),
               "SyncBatchNorm on cuda:0 against BatchNorm over the global batch on the CPU");
}

INSTANTIATE_TEST_SUITE_P(SharedGpu, SyncBatchNormOnCuda, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "ranks_shm"; });

// ---- ZeroRedundancyOptimizer ---------------------------------------------

// Parameters of uneven sizes, so the two ranks' shards differ.
nn::Sequential make_mlp() {
  ::torch::manual_seed(11);
  return nn::Sequential(nn::Linear(6, 24), nn::Tanh(), nn::Linear(24, 12), nn::Tanh(), nn::Linear(12, 3));
}

::torch::optim::AdamOptions adam() { return ::torch::optim::AdamOptions(1e-2); }

// The parameters, then each parameter's Adam moments (exp_avg, exp_avg_sq)
// from `optimizer`, on the CPU.
std::vector<Tensor> zero_result(const std::vector<Tensor>& params, ::torch::optim::Optimizer& optimizer) {
  std::vector<Tensor> out = to_cpu(params);
  for (const auto& p : params) {
    auto& state = static_cast<::torch::optim::AdamParamState&>(
        *optimizer.state().at(libtorch::optimizer_state_key(p)));
    out.push_back(state.exp_avg().to(::torch::kCPU));
    out.push_back(state.exp_avg_sq().to(::torch::kCPU));
  }
  return out;
}

// One rank: DDP and the sharded Adam; the consolidated state on rank 0
// (empty elsewhere).
std::vector<Tensor> train_zero(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches) {
  const int n = pg.size();
  auto net = make_mlp();
  net->to(device);
  DistributedDataParallel ddp(net, borrow(pg));
  ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), adam());
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(x.chunk(n)[rank].to(device)), y.chunk(n)[rank].to(device)).backward();
    opt.step();
  }
  opt.consolidate_state_dict(0);
  if (rank != 0) return {};
  return zero_result(net->parameters(), opt.consolidated());
}

std::vector<Tensor> zero_reference(const Batches& batches) {
  auto net = make_mlp();
  ::torch::optim::Adam opt(net->parameters(), adam());
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    opt.zero_grad();
    ::torch::mse_loss(net->forward(x), y).backward();
    opt.step();
  }
  return zero_result(net->parameters(), opt);
}

class ZeroOnCuda : public ::testing::TestWithParam<int> {};

TEST_P(ZeroOnCuda, ShardedAdamEqualsTheCpuAndTheUnshardedAdam) {
  SKIP_WITHOUT_GPU_DEVICE();
  const int n = GetParam();
  const Batches batches = make_batches({6}, 3);
  const TempDir dir;
  const std::string result = dir.path() + "/zero.pt";
  std::string why;
  const bool ran = testing::run_on_gpu(
      n, "shm", dir.path(),
      [&](int rank, ProcessGroup& pg) {
        auto state = train_zero(rank, pg, ::torch::Device(::torch::kCUDA, 0), batches);
        if (rank == 0) ::torch::save(state, result);
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<Tensor> on_gpu;
  ::torch::load(on_gpu, result);
  std::vector<Tensor> on_cpu;
  run_on_cpu(n, [&](int rank, ProcessGroup& pg) {
    auto state = train_zero(rank, pg, ::torch::Device(::torch::kCPU), batches);
    if (rank == 0) on_cpu = std::move(state);
  });
  expect_close(on_gpu, on_cpu, "ZeroRedundancyOptimizer on cuda:0 against the same on the CPU");
  expect_close(on_gpu, zero_reference(batches), "ZeroRedundancyOptimizer on cuda:0 against Adam on the CPU");
}

INSTANTIATE_TEST_SUITE_P(SharedGpu, ZeroOnCuda, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "ranks_shm"; });

// ---- PowerSGD --------------------------------------------------------------

constexpr int kPowerSgdSteps = 4;

// Every matrix compressed (rate 0) at rank 2, from the second step on, with
// error feedback and warm start: each part of the hook runs on the device.
PowerSGDOptions powersgd_options() {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 2;
  o.start_powersgd_iter = 1;
  o.min_compression_rate = 0;
  return o;
}

std::shared_ptr<PowerSGDHook> make_hook(bool batched) {
  return batched ? batched_powersgd_hook(powersgd_options()) : powersgd_hook(powersgd_options());
}

// One rank's DDP training with the hook: its parameters, then the elements
// the hook sent (as a one-element tensor).
std::vector<Tensor> train_powersgd(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches,
                                   bool batched) {
  const int n = pg.size();
  auto net = make_mlp();
  net->to(device);
  DDPOptions options;
  auto hook = make_hook(batched);
  options.comm_hook = hook;
  DistributedDataParallel ddp(net, borrow(pg), options);
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kPowerSgdSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(x.chunk(n)[rank].to(device)), y.chunk(n)[rank].to(device)).backward();
    opt.step();
  }
  auto out = to_cpu(net->parameters());
  out.push_back(::torch::full({1}, static_cast<double>(hook->compression_stats().elements_sent), ::torch::kDouble));
  return out;
}

Batches powersgd_batches() { return draw_batches(kPowerSgdSteps, 2000, {6}, 3); }

class PowerSgdOnCuda : public ::testing::TestWithParam<std::pair<int, bool>> {};

TEST_P(PowerSgdOnCuda, TrainsAsTheSameHookOnTheCpu) {
  SKIP_WITHOUT_GPU_DEVICE();
  const auto [n, batched] = GetParam();
  const Batches batches = powersgd_batches();
  const TempDir dir;
  const std::string result = dir.path() + "/powersgd.pt";
  std::string why;
  const bool ran = testing::run_on_gpu(
      n, "shm", dir.path(),
      [&](int rank, ProcessGroup& pg) {
        auto state = train_powersgd(rank, pg, ::torch::Device(::torch::kCUDA, 0), batches, batched);
        if (rank == 0) ::torch::save(state, result);
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<Tensor> on_gpu;
  ::torch::load(on_gpu, result);
  std::vector<Tensor> on_cpu;
  run_on_cpu(n, [&](int rank, ProcessGroup& pg) {
    auto state = train_powersgd(rank, pg, ::torch::Device(::torch::kCPU), batches, batched);
    if (rank == 0) on_cpu = std::move(state);
  });
  ASSERT_FALSE(on_cpu.empty());
  EXPECT_GT(on_cpu.back().item<double>(), 0) << "the hook never compressed: the test checks nothing";
  expect_close(on_gpu, on_cpu, std::string(batched ? "batched " : "") + "PowerSGD on cuda:0 against the same on the CPU");
}

INSTANTIATE_TEST_SUITE_P(SharedGpu, PowerSgdOnCuda,
                         // (In a world of one DDP sends nothing and runs no hook.)
                         ::testing::Values(std::make_pair(2, false), std::make_pair(2, true)),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "ranks_shm_" +
                                  (info.param.second ? "batched" : "per_tensor");
                         });

// ---- What is still refused, by name ---------------------------------------

// Each in a process of its own: the test process must not start CUDA
// (gpu_ranks.h).
TEST(CompanionRefusals, ZeroWithParametersOnTwoDevicesIsRefusedNamingBoth) {
  SKIP_WITHOUT_GPU_DEVICE();
  const TempDir dir;
  std::string why;
  const bool ran = testing::run_in_gpu_process(
      dir.path(),
      [] {
        auto net = make_mlp();
        net[2]->to(::torch::Device(::torch::kCUDA, 0));
        ThreadWorld world(1);
        testing::expect_invalid_argument(
            [&] { ZeroRedundancyOptimizer opt(net->parameters(), borrow(world.group(0)), adam()); },
            {"parameter 0 is on cpu but parameter 2 is on cuda:0", "all be on one device"});
      },
      &why);
  if (!ran) GTEST_SKIP() << why;
}

TEST(CompanionRefusals, SyncBatchNormWithInputOnAnotherDeviceIsRefusedNamingBoth) {
  SKIP_WITHOUT_GPU_DEVICE();
  const TempDir dir;
  std::string why;
  const bool ran = testing::run_in_gpu_process(
      dir.path(),
      [] {
        SyncBatchNorm layer(SyncBatchNormOptions(4));
        testing::expect_invalid_argument(
            [&] { layer->forward(::torch::randn({8, 4}, ::torch::Device(::torch::kCUDA, 0))); },
            {"input on cuda:0 but its weight is on cpu", "module->to(device)"});
      },
      &why);
  if (!ran) GTEST_SKIP() << why;
}

}  // namespace
}  // namespace lockstep::torch
