// DDP's companions on CUDA tensors (label gpu): SyncBatchNorm,
// ZeroRedundancyOptimizer and the PowerSGD hooks trained on cuda:0 in a
// world of one and by 2 rank processes sharing the GPU over shm, each
// against the same training on the CPU (thread ranks over shm) and against
// its one-process reference on the CPU (plain BatchNorm over the global
// batch; the unsharded Adam, whose state the consolidated one must equal;
// PowerSGD written out with libtorch's operations). The bodies and the
// references are companions_cases.h's, which companions_cpu_test runs on
// the CPU in every `make test`. The ranks are processes, and the parent
// never touches CUDA before forking them (a forked child cannot use a CUDA
// its parent started): see ddp_cuda_test.cc, whose harness this follows.
//
// Compiled against any libtorch, so it cannot rot where there is no GPU;
// every test skips unless libtorch sees a CUDA device.
//
// Tolerance: relative 1e-4, absolute 1e-5 (fp32, TF32 off: the GPU differs
// from the CPU only in the order of its sums).
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "torch/companions_cases.h"
#include "torch/gpu_ranks.h"
#include "torch/thread_ranks.h"
#include "lockstep/error.h"
#include "lockstep/torch/sync_batchnorm.h"
#include "lockstep/torch/zero.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
using lockstep::testing::TempDir;
using namespace lockstep::testing::companions;
namespace nn = ::torch::nn;

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

const ::torch::Device kGpu(::torch::kCUDA, 0);
const ::torch::Device kCpu(::torch::kCPU);

// Runs body(rank, group, model) on the CPU in `n` thread ranks over shm,
// each with a model made here, before the ranks start.
template <class Body>
void run_on_cpu(int n, nn::Sequential (*make_model)(), Body body) {
  at::set_num_threads(1);
  std::vector<nn::Sequential> models;
  for (int r = 0; r < n; ++r) models.push_back(make_model());
  TorchThreadWorld world(n, "shm");
  world.run([&](int rank, ProcessGroup& pg) { body(rank, pg, models[static_cast<std::size_t>(rank)]); });
}

// ---- SyncBatchNorm -------------------------------------------------------

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
        auto state = train_sync_batchnorm(rank, pg, kGpu, batches, make_convnet());
        if (rank == 0) ::torch::save(state, result);
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<Tensor> on_gpu;
  ::torch::load(on_gpu, result);
  std::vector<Tensor> on_cpu;
  run_on_cpu(n, make_convnet, [&](int rank, ProcessGroup& pg, nn::Sequential net) {
    auto state = train_sync_batchnorm(rank, pg, kCpu, batches, net);
    if (rank == 0) on_cpu = std::move(state);
  });
  expect_close(on_gpu, on_cpu, "SyncBatchNorm on cuda:0 against SyncBatchNorm on the CPU");
  expect_close(on_gpu, sync_batchnorm_reference(n, batches),
               "SyncBatchNorm on cuda:0 against BatchNorm over the global batch on the CPU");
}

INSTANTIATE_TEST_SUITE_P(SharedGpu, SyncBatchNormOnCuda, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "ranks_shm"; });

// ---- ZeroRedundancyOptimizer ---------------------------------------------

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
        auto state = train_zero(rank, pg, kGpu, batches, make_mlp());
        if (rank == 0) ::torch::save(state, result);
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<Tensor> on_gpu;
  ::torch::load(on_gpu, result);
  std::vector<Tensor> on_cpu;
  run_on_cpu(n, make_mlp, [&](int rank, ProcessGroup& pg, nn::Sequential net) {
    auto state = train_zero(rank, pg, kCpu, batches, net);
    if (rank == 0) on_cpu = std::move(state);
  });
  expect_close(on_gpu, on_cpu, "ZeroRedundancyOptimizer on cuda:0 against the same on the CPU");
  expect_close(on_gpu, zero_reference(batches), "ZeroRedundancyOptimizer on cuda:0 against Adam on the CPU");
}

INSTANTIATE_TEST_SUITE_P(SharedGpu, ZeroOnCuda, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "ranks_shm"; });

// ---- PowerSGD --------------------------------------------------------------

class PowerSgdOnCuda : public ::testing::TestWithParam<std::pair<int, bool>> {};

TEST_P(PowerSgdOnCuda, TrainsAsTheSameHookOnTheCpuAndAsPowerSgdWrittenOut) {
  SKIP_WITHOUT_GPU_DEVICE();
  const auto [n, batched] = GetParam();
  const Batches batches = powersgd_batches();
  const TempDir dir;
  const std::string result = dir.path() + "/powersgd";
  std::string why;
  const bool ran = testing::run_on_gpu(
      n, "shm", dir.path(),
      [&](int rank, ProcessGroup& pg) {
        auto run = train_powersgd(rank, pg, kGpu, batches, batched, make_mlp());
        if (rank == 0) save(run, result);
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  const PowerSgdRun on_gpu = load_powersgd_run(result);
  PowerSgdRun on_cpu;
  run_on_cpu(n, make_mlp, [&](int rank, ProcessGroup& pg, nn::Sequential net) {
    auto run = train_powersgd(rank, pg, kCpu, batches, batched, net);
    if (rank == 0) on_cpu = std::move(run);
  });
  const std::string what = std::string(batched ? "batched " : "") + "PowerSGD on cuda:0";
  EXPECT_GT(on_gpu.elements_sent, 0) << "the hook never compressed: the test checks nothing";
  EXPECT_EQ(on_gpu.elements_sent, on_cpu.elements_sent) << what << " sent other matrices than on the CPU";
  expect_close(on_gpu.params, on_cpu.params, what + " against the same on the CPU");
  expect_close(on_gpu.params, powersgd_reference(n, batches, batched, on_gpu.layout).params,
               what + " against PowerSGD written out in one process");
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
        TorchThreadWorld world(1);
        testing::expect_invalid_argument(
            [&] {
              ZeroRedundancyOptimizer opt(net->parameters(), borrow(world.group(0)),
                                          ::torch::optim::AdamOptions(1e-2));
            },
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
