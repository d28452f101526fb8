// DistributedDataParallel on CUDA parameters (label gpu): 2 rank processes
// sharing this machine's GPU, over shm and tcp (each stages the device's
// buckets through pinned host memory), and a world of one, against one
// process training on the whole global batch on the CPU, and against the
// same DDP on the CPU. The ranks are processes, not threads: libtorch runs
// every backward on a device of a process on one thread, which thread
// ranks would share, and the parent never touches CUDA (a forked child
// cannot use a CUDA its parent started). Each DDP option the CPU suite covers runs here too:
// bucket layouts, bucket views, no_sync accumulation, unused parameters,
// a static graph, the fp16 / bf16 hooks, and BatchNorm's buffers
// broadcast from rank 0.
//
// Compiled against any libtorch, so it cannot rot where there is no GPU;
// every test skips unless libtorch sees a CUDA device.
//
// Tolerance: rtol 1e-4 (absolute 1e-5) for fp32 gradients. The GPU's
// kernels sum in other orders than the CPU's; TF32 is turned off, so that
// is the only difference. The compression hooks keep their CPU tolerances.
#include <gtest/gtest.h>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "harness/process_ranks.h"
#include "torch/gpu_ranks.h"
#include "torch/thread_ranks.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/join.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
using lockstep::testing::TempDir;
using lockstep::testing::exact_fp32;
namespace nn = ::torch::nn;


struct NetImpl : nn::Module {
  explicit NetImpl(bool with_side) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 4, 3)));
    bn = register_module("bn", nn::BatchNorm2d(4));
    fc1 = register_module("fc1", nn::Linear(4 * 6 * 6, 32));
    fc2 = register_module("fc2", nn::Linear(32, 4));
    if (with_side) side = register_module("side", nn::Linear(32, 4));  // a branch used only when asked
  }
  ::torch::Tensor forward(const ::torch::Tensor& x, bool use_side) {
    auto h = ::torch::relu(fc1(::torch::relu(bn(conv(x))).flatten(1)));
    auto y = fc2(h);
    return use_side ? y + side(h) : y;
  }
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr}, side{nullptr};
};
TORCH_MODULE(Net);

constexpr int kGlobalBatch = 32;
constexpr int kSteps = 4;

struct Case {
  std::string name;
  DDPOptions options;
  int micro_batches = 1;                          // > 1: no_sync for all but the last
  std::function<bool(int step, int rank)> side;  // whether the side branch is used; null: never
  double rtol = 1e-4;
};

DDPOptions with(const std::function<void(DDPOptions&)>& f) {
  DDPOptions o;
  f(o);
  return o;
}

std::vector<Case> cases() {
  const auto unused = [](DDPOptions& o) { o.find_unused_parameters = true; };
  return {
      {"default_buckets", {}},
      {"one_parameter_per_bucket", with([](DDPOptions& o) { o.bucket_cap_mb = o.first_bucket_mb = 1e-9; })},
      {"small_buckets_rebuilt", with([](DDPOptions& o) { o.bucket_cap_mb = o.first_bucket_mb = 0.002; })},
      {"gradient_as_bucket_view", with([](DDPOptions& o) { o.gradient_as_bucket_view = true; })},
      {"no_sync_2_micro_batches", {}, 2},
      {"unused_branch_some_ranks", with(unused), 1, [](int step, int rank) { return (step + rank) % 2 == 0; }},
      {"unused_branch_everywhere", with(unused), 1, [](int, int) { return false; }},
      {"static_graph", with([](DDPOptions& o) { o.static_graph = true; })},
      {"fp16_hook", with([](DDPOptions& o) { o.comm_hook = fp16_compress_hook(); }), 1, nullptr, 2e-2},
      {"bf16_hook", with([](DDPOptions& o) { o.comm_hook = bf16_compress_hook(); }), 1, nullptr, 5e-2},
  };
}

std::pair<::torch::Tensor, ::torch::Tensor> global_batch(int step) {
  ::torch::manual_seed(1000 + step);
  return {::torch::randn({kGlobalBatch, 1, 8, 8}), ::torch::randn({kGlobalBatch, 4})};
}

Net make_model(int seed, bool with_side = false) {
  ::torch::manual_seed(seed);
  return Net(with_side);
}

// The parameters, then (with_buffers) BatchNorm's statistics, on the CPU.
std::vector<::torch::Tensor> snapshot(nn::Module& m, bool with_buffers) {
  std::vector<::torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().to(::torch::kCPU).clone());
  if (with_buffers)
    for (auto& b : m.buffers()) out.push_back(b.detach().to(::torch::kCPU).clone());
  return out;
}

// One process on the CPU, the global batch cut into the ranks' shards
// (each into micro-batches), their gradients accumulated.
std::vector<::torch::Tensor> reference(int shards, const Case& c) {
  auto model = make_model(7, c.side != nullptr);  // rank 0's seed: DDP starts everyone from rank 0's values
  ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
  const int pieces = shards * c.micro_batches;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step);
    model->zero_grad();
    for (int k = 0; k < pieces; ++k) {
      const bool side = c.side && c.side(step, k / c.micro_batches);
      (::torch::mse_loss(model->forward(x.chunk(pieces)[k], side), y.chunk(pieces)[k]) / pieces).backward();
    }
    opt.step();
  }
  // Its BatchNorm statistics saw every shard, rank 0's only its own: the
  // parameters are compared.
  return snapshot(*model, false);
}

using Batches = std::vector<std::pair<::torch::Tensor, ::torch::Tensor>>;

// What a rank trains: its replica (made from a seed of its own on purpose:
// DDP broadcasts rank 0's) and the global batches. Made on one thread:
// libtorch's default generator is one per process, and thread ranks
// drawing from it at once would race.
std::pair<Net, Batches> rank_inputs(int rank, const Case& c) {
  Net model = make_model(7 + rank, c.side != nullptr);
  Batches batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(global_batch(step));
  return {model, batches};
}

// One rank's DDP training on `device` with group `pg`: its parameters and
// buffers after the last step (rank 0's are broadcast at every forward).
std::vector<::torch::Tensor> train_rank(int rank, ProcessGroup& pg, const Case& c, ::torch::Device device,
                                        Net model, const Batches& batches) {
  const int n = pg.size();
  model->to(device);
  DistributedDataParallel<NetImpl> ddp(model.ptr(), std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}),
                                       c.options);
  ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    const auto& [x, y] = batches[static_cast<std::size_t>(step)];
    auto xs = x.chunk(n)[rank].to(device), ys = y.chunk(n)[rank].to(device);
    const bool side = c.side && c.side(step, rank);
    model->zero_grad();
    for (int m = 0; m < c.micro_batches; ++m) {
      auto xm = xs.chunk(c.micro_batches)[m], ym = ys.chunk(c.micro_batches)[m];
      if (m + 1 < c.micro_batches) {
        auto guard = ddp.no_sync();
        (::torch::mse_loss(ddp.forward(xm, side), ym) / c.micro_batches).backward();
      } else {
        (::torch::mse_loss(ddp.forward(xm, side), ym) / c.micro_batches).backward();
      }
    }
    opt.step();
  }
  return snapshot(*model, true);
}

// DDP on the CPU over `n` thread ranks: rank 0's state.
std::vector<::torch::Tensor> train_on_cpu(int n, const std::string& backend, const Case& c) {
  std::vector<std::pair<Net, Batches>> inputs;
  for (int rank = 0; rank < n; ++rank) inputs.push_back(rank_inputs(rank, c));
  TorchThreadWorld world(n, backend);
  std::vector<::torch::Tensor> out;
  world.run([&](int rank, ProcessGroup& pg) {
    const auto& [model, batches] = inputs[static_cast<std::size_t>(rank)];
    auto state = train_rank(rank, pg, c, ::torch::Device(::torch::kCPU), model, batches);
    if (rank == 0) out = std::move(state);
  });
  return out;
}

// Every case on cuda:0 in `n` rank processes; rank 0 saves its state per
// case into `dir`.
bool train_on_gpu(int n, const std::string& backend, const std::string& dir, std::string* why) {
  return testing::run_on_gpu(
      n, backend, dir,
      [&](int rank, ProcessGroup& pg) {
        for (const Case& c : cases()) {
          auto [model, batches] = rank_inputs(rank, c);
          auto state = train_rank(rank, pg, c, ::torch::Device(::torch::kCUDA, 0), model, batches);
          if (rank == 0) ::torch::save(state, dir + "/" + c.name + ".pt");
        }
      },
      why, std::chrono::seconds(600));
}

void expect_close(const std::vector<::torch::Tensor>& got, const std::vector<::torch::Tensor>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto g = got[i].to(::torch::kDouble), w = want[i].to(::torch::kDouble);
    EXPECT_TRUE(::torch::allclose(g, w, rtol, rtol * 0.1))
        << what << ": tensor " << i << " differs by " << (g - w).abs().max().item<double>() << " (scale "
        << w.abs().max().item<double>() << ")";
  }
}

// Uneven inputs under Join: rank r has kJoinSteps[r] batches of its own
// and, once out, shadows the others with zeros from device scratch. The
// averages divide by the ranks still training, so the buckets are rescaled
// on the device as well.
constexpr int kJoinSteps[] = {2, 4};

std::vector<::torch::Tensor> train_join_rank(int rank, ProcessGroup& pg, ::torch::Device device, Net model,
                                             const Batches& batches) {
  model->to(device);
  DistributedDataParallel<NetImpl> ddp(model.ptr(), std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
  ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05));
  JoinOptions options;
  options.divide_by_initial_world_size = false;
  {
    Join join({ddp}, options);
    for (int step = 0; step < kJoinSteps[rank]; ++step) {
      const auto& [x, y] = batches[static_cast<std::size_t>(step)];
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x.chunk(2)[rank].to(device), false), y.chunk(2)[rank].to(device)).backward();
      opt.step();
    }
    join.join();
  }
  return snapshot(*model, true);
}

class OnCuda : public ::testing::TestWithParam<std::pair<int, std::string>> {};

TEST_P(OnCuda, DdpEqualsOneProcessOnTheCpuAndDdpOnTheCpu) {
  SKIP_WITHOUT_GPU_DEVICE();
  const auto [n, backend] = GetParam();
  // The GPU ranks first: the parent forks them before it starts any thread.
  const TempDir dir;
  std::string why;
  if (!train_on_gpu(n, backend, dir.path(), &why)) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  at::set_num_threads(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<::torch::Tensor> on_gpu;
    ::torch::load(on_gpu, dir.path() + "/" + c.name + ".pt");
    const auto want = reference(n, c);
    const auto on_cpu = train_on_cpu(n, backend, c);
    ASSERT_GE(on_gpu.size(), want.size());
    const std::vector<::torch::Tensor> gpu_parameters(on_gpu.begin(), on_gpu.begin() + static_cast<long>(want.size()));
    expect_close(gpu_parameters, want, c.rtol, c.name + ": DDP on cuda:0 against one process on the CPU");
    expect_close(on_gpu, on_cpu, c.rtol, c.name + ": DDP on cuda:0 against DDP on the CPU");
  }
}

// The CPU twin that the GPU test compares with, held to the one-process
// reference on every machine (no GPU needed), so that it cannot drift from
// the truth between the rare runs on a GPU.
class CpuTwin : public ::testing::TestWithParam<std::pair<int, std::string>> {};

TEST_P(CpuTwin, DdpOnTheCpuEqualsOneProcess) {
  const auto [n, backend] = GetParam();
  at::set_num_threads(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto want = reference(n, c);
    const auto on_cpu = train_on_cpu(n, backend, c);
    ASSERT_GE(on_cpu.size(), want.size());
    expect_close(std::vector<::torch::Tensor>(on_cpu.begin(), on_cpu.begin() + static_cast<long>(want.size())), want,
                 c.rtol, c.name + ": the CPU twin against one process");
  }
}

INSTANTIATE_TEST_SUITE_P(ThreadRanks, CpuTwin,
                         ::testing::Values(std::make_pair(2, std::string("shm")), std::make_pair(2, std::string("tcp"))),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "ranks_" + info.param.second;
                         });

// Join on the GPU: two rank processes over shm, against the same Join on
// the CPU (join_test checks the CPU against its reference semantics).
TEST(OnCudaJoin, UnevenInputsEndWithTheSameModelAsOnTheCpu) {
  SKIP_WITHOUT_GPU_DEVICE();
  const TempDir dir;
  const std::string result = dir.path() + "/join.pt";
  std::string why;
  const bool ran = testing::run_on_gpu(
      2, "shm", dir.path(),
      [&](int rank, ProcessGroup& pg) {
        auto [model, batches] = rank_inputs(rank, Case{});
        auto state = train_join_rank(rank, pg, ::torch::Device(::torch::kCUDA, 0), model, batches);
        if (rank == 0) ::torch::save(state, result);
      },
      &why, std::chrono::seconds(600));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<::torch::Tensor> on_gpu;
  ::torch::load(on_gpu, result);
  at::set_num_threads(1);
  std::vector<std::pair<Net, Batches>> inputs;
  for (int rank = 0; rank < 2; ++rank) inputs.push_back(rank_inputs(rank, Case{}));
  TorchThreadWorld world(2, "shm");
  std::vector<::torch::Tensor> on_cpu;
  world.run([&](int rank, ProcessGroup& pg) {
    const auto& [model, batches] = inputs[static_cast<std::size_t>(rank)];
    auto state = train_join_rank(rank, pg, ::torch::Device(::torch::kCPU), model, batches);
    if (rank == 0) on_cpu = std::move(state);
  });
  expect_close(on_gpu, on_cpu, 1e-4, "Join: DDP on cuda:0 against DDP on the CPU");
}

INSTANTIATE_TEST_SUITE_P(SharedGpu, OnCuda,
                         ::testing::Values(std::make_pair(1, std::string("shm")), std::make_pair(2, std::string("shm")),
                                           std::make_pair(2, std::string("tcp"))),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "ranks_" + info.param.second;
                         });

// A module with parameters on two devices is refused by name, in a process
// of its own: the test process must not start CUDA (gpu_ranks.h).
TEST(OnCudaRefusals, AModuleSplitAcrossDevicesIsRefusedNamingBoth) {
  SKIP_WITHOUT_GPU_DEVICE();
  const TempDir dir;
  std::string why;
  const bool ran = testing::run_in_gpu_process(
      dir.path(),
      [] {
        Net model = make_model(7);
        model->fc2->to(::torch::Device(::torch::kCUDA, 0));
        TorchThreadWorld world(1);
        testing::expect_invalid_argument(
            [&] {
              DistributedDataParallel<NetImpl> ddp(
                  model.ptr(), std::shared_ptr<ProcessGroup>(&world.group(0), [](ProcessGroup*) {}));
            },
            {"fc2.weight' is on cuda:0", "on one device"});
      },
      &why);
  if (!ran) GTEST_SKIP() << why;
}

}  // namespace
}  // namespace lockstep::torch
