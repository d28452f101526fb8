// fully_shard on CUDA parameters: 2 rank processes on cuda:0 (the staged
// shm backend moves the gathers and reduce-scatters through host memory)
// train fsdp_fixtures' blocks, resharding after forward and not, and end
// equal to one process training on the CPU (TF32 off; the GPU sums in
// other orders, within the CPU tests' tolerance). Compiled against every
// libtorch so it cannot rot; skips without a GPU (fully_shard_test is its
// CPU twin, the same bodies on thread ranks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "harness/launcher.h"
#include "lockstep/torch/fully_shard.h"
#include "torch/fsdp_fixtures.h"
#include "torch/gpu_ranks.h"

namespace lockstep::torch {
namespace {

using namespace fsdp_fixtures;
using testing::TempDir;

constexpr int kRanks = 2;

class FullyShardOnCuda : public ::testing::TestWithParam<bool> {};

TEST_P(FullyShardOnCuda, TrainingEqualsOneProcessOnTheCpu) {
  SKIP_WITHOUT_GPU_DEVICE();
  const bool reshard = GetParam();
  const TempDir dir;
  std::string why;
  const bool ran = testing::run_on_gpu(
      kRanks, "shm", dir.path(),
      [&](int rank, ProcessGroup& pg) {
        const ::torch::Device cuda(::torch::kCUDA, 0);
        auto plain = plain_mlp();
        plain->to(cuda);
        FullyShardOptions options;
        options.reshard_after_forward = reshard;
        auto model = sharded_mlp(plain, borrow(pg), options);
        auto opt = make_optimizer("adam", model->parameters());
        for (const auto& [x, y] : batches(kWidths.front(), 59)) {
          opt->zero_grad();
          ::torch::mse_loss(model->forward(shard_of(x, rank, kRanks).to(cuda)), shard_of(y, rank, kRanks).to(cuda))
              .backward();
          opt->step();
        }
        const State state = model->full_state_dict(0);
        if (rank != 0) return;
        std::vector<std::string> names;
        std::vector<::torch::Tensor> tensors;
        for (const auto& [name, t] : state) {
          names.push_back(name);
          tensors.push_back(t);
        }
        ::torch::save(tensors, dir.path() + "/state.pt");
      },
      &why, std::chrono::seconds(300));
  if (!ran) GTEST_SKIP() << why;
  if (HasFailure()) return;  // a rank failed: its output is above
  std::vector<::torch::Tensor> tensors;
  ::torch::load(tensors, dir.path() + "/state.pt");
  const State want = train_reference("adam", batches(kWidths.front(), 59));
  State got;
  std::size_t k = 0;
  for (const auto& [name, t] : want) got[name] = tensors.at(k++);  // the same names, in the same (sorted) order
  expect_close(got, want, kRtol, reshard ? "resharded" : "kept");
}

INSTANTIATE_TEST_SUITE_P(Resharding, FullyShardOnCuda, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "reshard" : "keep"; });

}  // namespace
}  // namespace lockstep::torch
