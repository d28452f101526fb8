// DDP's companions trained as their tests on every device run them:
// SyncBatchNorm, ZeroRedundancyOptimizer and the PowerSGD hooks, one rank's
// body on the device it is given, and the one-process reference each is
// held to. The GPU test (companions_cuda_test, rank processes on cuda:0)
// and the CPU test (companions_cpu_test, thread ranks, in `make test`) run
// the same bodies against the same references, so a CPU run shows what a
// GPU run would, short of the device itself.
//
// A rank's model is made by the caller and handed in: thread ranks must
// not draw from libtorch's process-wide generator (torch/thread_ranks.h).
// Thread-safe: pure functions of their arguments.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::testing::companions {

using ::torch::Tensor;
using Batches = std::vector<std::pair<Tensor, Tensor>>;
using BucketLayout = std::vector<std::vector<std::string>>;

inline constexpr int kGlobalBatch = 16;
inline constexpr int kSteps = 3;
inline constexpr int kPowerSgdSteps = 4;

// The global batches: inputs of kGlobalBatch x input_shape and targets of
// kGlobalBatch x outputs, drawn from CPU generators of their own (the GPU
// test's parent must not touch CUDA, which ::torch::manual_seed does).
Batches make_batches(std::vector<std::int64_t> input_shape, std::int64_t outputs);
Batches powersgd_batches();

// Conv2d, BatchNorm2d, ReLU, Linear (inputs 2 x 6 x 6, 3 outputs).
::torch::nn::Sequential make_convnet();
// Three Linear layers of uneven sizes (6 inputs, 3 outputs), so that two
// ranks' ZeRO shards differ.
::torch::nn::Sequential make_mlp();

// ---- SyncBatchNorm: each rank its shard through SyncBatchNorm and DDP.
// The parameters, the running statistics and the first step's gradient of
// the rank's input, on the CPU.
std::vector<Tensor> train_sync_batchnorm(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches,
                                         ::torch::nn::Sequential net);
// One process, plain BatchNorm over the whole global batch; the input's
// gradient is rank 0's part of the global one, times the ranks.
std::vector<Tensor> sync_batchnorm_reference(int ranks, const Batches& batches);

// ---- ZeroRedundancyOptimizer: DDP and the sharded Adam. The parameters and
// each one's Adam moments from the state consolidated on rank 0 (empty on
// the other ranks).
std::vector<Tensor> train_zero(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches,
                               ::torch::nn::Sequential net);
// One process, the unsharded Adam over the global batch.
std::vector<Tensor> zero_reference(const Batches& batches);

// ---- PowerSGD at rank 2 on every matrix from the second step on, with
// error feedback and warm start.
struct PowerSgdRun {
  std::vector<Tensor> params;  // rank 0's, on the CPU
  double elements_sent = 0;    // what rank 0's hook sent
  BucketLayout layout;         // DDP's buckets after their rebuild (the hook's seeds follow them)
};
PowerSgdRun train_powersgd(int rank, ProcessGroup& pg, ::torch::Device device, const Batches& batches, bool batched,
                           ::torch::nn::Sequential net);
// PowerSGD written out in one process with libtorch's own operations, in
// double: every rank's gradient on its shard, then per matrix (per tensor)
// or per bucket (batched) P = sum_r M_r Q, orthogonalised, Q = mean_r
// M_r^T P, M = P Q^T, each rank keeping its own error; the random Qs are
// drawn as the hook draws them (by bucket index, from `layout`). What the
// hook must compute, derived without it. Steps before
// first_compressed_step are averaged plainly (the hook's
// start_powersgd_iter is 1).
PowerSgdRun powersgd_reference(int ranks, const Batches& batches, bool batched, const BucketLayout& layout,
                               int first_compressed_step = 1);

// Saves and loads a run (a rank process hands its result to the test).
void save(const PowerSgdRun& run, const std::string& path);
PowerSgdRun load_powersgd_run(const std::string& path);

// Fails the current test where a tensor differs beyond rtol 1e-4 (absolute
// 1e-5): fp32 on each side, the sums in other orders.
void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what);

}  // namespace lockstep::testing::companions
