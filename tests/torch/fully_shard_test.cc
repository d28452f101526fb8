// fully_shard against one process training on the global batch: N thread
// ranks (2, 3, 4) over shared memory, models of blocks whose sizes are not
// multiples of the world, with and without resharding after forward, SGD
// and Adam; a convnet with SyncBatchNorm and its buffers; mixed precision
// against the same arithmetic in one process; accumulation without sync,
// clipping, state dicts at another world size, sharded checkpoints, and a
// rank that skips a unit.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/sync_batchnorm.h"
#include "torch/fsdp_fixtures.h"
#include "torch/thread_ranks.h"

namespace lockstep::torch {
namespace {

using testing::per_rank;
using testing::TorchThreadWorld;

using namespace fsdp_fixtures;

using Case = std::tuple<int, bool, std::string>;  // ranks, reshard_after_forward, optimizer

class Equivalence : public ::testing::TestWithParam<Case> {};

// `ranks` thread ranks over `backend` train the sharded model on their
// parts of the batches `seed` draws; every rank's whole parameters must
// equal one process training on the global batches.
void expect_training_equals_one_process(int ranks, const std::string& backend, const std::string& optimizer,
                                        const FullyShardOptions& options, std::uint64_t seed) {
  const auto data = batches(kWidths.front(), seed);
  const State want = train_reference(optimizer, data);
  auto plains = per_rank(ranks, [](int) { return plain_mlp(); });
  std::vector<State> got(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, backend);
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), options);
    auto opt = make_optimizer(optimizer, model->parameters());
    for (const auto& [x, y] : data) {
      opt->zero_grad();
      ::torch::mse_loss(model->forward(shard_of(x, rank, ranks)), shard_of(y, rank, ranks)).backward();
      opt->step();
    }
    got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
  });
  for (int r = 0; r < ranks; ++r) expect_close(got[static_cast<std::size_t>(r)], want, kRtol, "rank " + std::to_string(r));
}

TEST_P(Equivalence, TrainingEqualsOneProcessOnTheGlobalBatch) {
  const auto& [ranks, reshard, optimizer] = GetParam();
  FullyShardOptions options;
  options.reshard_after_forward = reshard;
  expect_training_equals_one_process(ranks, "shm", optimizer, options, 17);
}

INSTANTIATE_TEST_SUITE_P(RanksReshardOptimizers, Equivalence,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool(),
                                            ::testing::Values(std::string("sgd"), std::string("adam"))),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  (std::get<1>(info.param) ? "reshard_" : "keep_") + std::get<2>(info.param);
                         });

// The same over the other backends of one host: tcp, and hier with ranks
// posing as hosts of 2 (shm inside each, tcp across). mpi: mpi_fully_shard_test.
class OverBackends : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(OverBackends, TrainingEqualsOneProcessOnTheGlobalBatch) {
  const auto& [backend, ranks] = GetParam();
  expect_training_equals_one_process(ranks, backend, "adam", {}, 19);
}

INSTANTIATE_TEST_SUITE_P(Backends, OverBackends,
                         ::testing::Values(std::make_tuple(std::string("tcp"), 2), std::make_tuple(std::string("tcp"), 3),
                                           std::make_tuple(std::string("hier2"), 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

// The reduce-scatter folded over the ranks in rank order
// (reduce_in_shard_order, which ShardBackup sets) where the backend's own
// folds otherwise.
class InShardOrder : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(InShardOrder, TrainingEqualsOneProcessOnTheGlobalBatch) {
  const auto& [backend, ranks] = GetParam();
  FullyShardOptions options;
  options.reduce_in_shard_order = true;
  expect_training_equals_one_process(ranks, backend, "adam", options, 23);
}

INSTANTIATE_TEST_SUITE_P(Backends, InShardOrder,
                         ::testing::Values(std::make_tuple(std::string("tcp"), 3), std::make_tuple(std::string("hier2"), 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
                         });

TEST(FullyShard, ParametersHoldOnlyThisRanksPieceBetweenSteps) {
  auto plains = per_rank(3, [](int) { return plain_mlp(); });
  std::int64_t total = 0;
  for (const auto& p : plains[0]->parameters()) total += p.numel();
  std::vector<std::int64_t> held(3), shards(3);
  TorchThreadWorld world(3, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.dim(), 1);
      held[static_cast<std::size_t>(rank)] += p.numel();
    }
    for (const auto& m : model->modules())
      if (auto* unit = dynamic_cast<FullyShardModule*>(m.get())) shards[static_cast<std::size_t>(rank)] += unit->shard_elements();
  });
  EXPECT_EQ(held[0] + held[1] + held[2], total);
  // Each of the 4 units pads its shard to a whole split plus its ordinal (0-3).
  const std::int64_t units = 4, padding = units * (1 + units);
  for (int r = 0; r < 3; ++r) {
    EXPECT_LE(held[static_cast<std::size_t>(r)], shards[static_cast<std::size_t>(r)]);
    EXPECT_LE(shards[static_cast<std::size_t>(r)], total / 3 + padding);
  }
}

// libtorch 2's zero_grad sets gradients to none, 1.13's zeroes them in
// place (detach_, then zero_). Set to none, a parameter's gradient is its
// piece of the reduced shard, over the shard's memory: it must still be a
// gradient of its own (writing one leaves the others as they were) that
// zeroing in place accepts, and either way training equals one process.
TEST(FullyShard, GradientsSetToNoneOrZeroedInPlaceTrainAsOneProcess) {
  for (const bool to_none : {true, false}) {
    SCOPED_TRACE(to_none ? "set to none" : "zeroed in place");
    const auto data = batches(kWidths.front(), 13);
    const State want = train_reference("sgd", data);
    auto plains = per_rank(2, [](int) { return plain_mlp(); });
    std::vector<State> got(2);
    TorchThreadWorld world(2, "shm");
    world.run([&](int rank, ProcessGroup& pg) {
      auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
      auto opt = make_optimizer("sgd", model->parameters());
      for (const auto& [x, y] : data) {
        for (auto& p : model->parameters()) {
          if (!p.grad().defined()) continue;
          if (to_none) {
            p.mutable_grad() = Tensor();
          } else {
            p.mutable_grad().detach_();
            p.mutable_grad().zero_();
          }
        }
        ::torch::mse_loss(model->forward(shard_of(x, rank, 2)), shard_of(y, rank, 2)).backward();
        opt->step();
      }
      std::vector<Tensor> grads;
      for (const auto& p : model->parameters())
        if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
      ASSERT_GE(grads.size(), 2u);
      std::vector<Tensor> others;
      for (std::size_t i = 1; i < grads.size(); ++i) others.push_back(grads[i].clone());
      grads[0].fill_(7.0);
      for (std::size_t i = 1; i < grads.size(); ++i)
        EXPECT_TRUE(::torch::equal(grads[i], others[i - 1])) << "rank " << rank << ", gradient " << i;
      got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
    });
    for (int r = 0; r < 2; ++r)
      expect_close(got[static_cast<std::size_t>(r)], want, kRtol, "rank " + std::to_string(r));
  }
}

// ---- a convnet with SyncBatchNorm: buffers and a unit of several layers ----

struct ConvBlockImpl : nn::Module {
  ConvBlockImpl()
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(2, 5, 3)))),
        norm(register_module("norm", SyncBatchNorm(SyncBatchNormOptions(5)))) {}
  Tensor forward(Tensor x) { return ::torch::relu(norm->forward(conv->forward(x))); }
  nn::Conv2d conv;
  SyncBatchNorm norm;
};
TORCH_MODULE(ConvBlock);

nn::Sequential plain_convnet() {
  nn::Sequential net(ConvBlock(), nn::Flatten(), nn::Linear(5 * 4 * 4, kOutputs));
  init_from(*net, 9);
  return net;
}

TEST(FullyShard, ConvnetWithSyncBatchNormEqualsOneProcess) {
  constexpr int kRanks = 2;
  auto gen = at::detail::createCPUGenerator(23);
  std::vector<Batch> data;
  for (int s = 0; s < kSteps; ++s)
    data.push_back({::torch::randn({kGlobalBatch, 2, 6, 6}, gen), ::torch::randn({kGlobalBatch, kOutputs}, gen)});
  auto reference = plain_convnet();
  ::torch::optim::SGD ref_opt(reference->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  for (const auto& [x, y] : data) {
    ref_opt.zero_grad();
    ::torch::mse_loss(reference->forward(x), y).backward();
    ref_opt.step();
  }
  const State want = named(*reference);
  auto plains = per_rank(kRanks, [](int) { return plain_convnet(); });
  std::vector<State> got(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto& plain = plains[static_cast<std::size_t>(rank)];
    convert_sync_batchnorm(plain->ptr(0), borrow(pg));
    nn::Sequential net;
    net->push_back(fully_shard(plain->ptr<ConvBlockImpl>(0), borrow(pg)));
    net->push_back(*(plain->begin() + 1));
    net->push_back(*(plain->begin() + 2));
    auto model = fully_shard(net, borrow(pg));
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    for (const auto& [x, y] : data) {
      opt.zero_grad();
      ::torch::mse_loss(model->forward(shard_of(x, rank, kRanks)), shard_of(y, rank, kRanks)).backward();
      opt.step();
    }
    got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
  });
  for (int r = 0; r < kRanks; ++r) expect_close(got[static_cast<std::size_t>(r)], want, kRtol, "rank " + std::to_string(r));
}

// ---- mixed precision ------------------------------------------------------

// What fully_shard does with param_dtype bf16 and reduce_dtype fp32, in one
// process: each rank's gradients computed with bf16 copies of the fp32
// parameters on its part of the batch, averaged in fp32, stepped in fp32.
State train_mixed_reference(const std::vector<Batch>& data, int ranks) {
  auto master = plain_mlp();
  ::torch::optim::SGD opt(master->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
  for (const auto& [x, y] : data) {
    opt.zero_grad();
    std::vector<Tensor> sum;
    for (int r = 0; r < ranks; ++r) {
      auto low = plain_mlp();
      {
        ::torch::NoGradGuard no_grad;
        auto from = master->parameters();
        auto to = low->parameters();
        for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
      }
      low->to(::torch::kBFloat16);
      // The loss in fp32 (libtorch 1.13 has no bf16 mse_loss), as below.
      ::torch::mse_loss(low->forward(shard_of(x, r, ranks).to(::torch::kBFloat16)).to(::torch::kFloat),
                        shard_of(y, r, ranks))
          .backward();
      auto grads = low->parameters();
      for (std::size_t i = 0; i < grads.size(); ++i) {
        Tensor g = grads[i].grad().to(::torch::kFloat);
        if (sum.size() <= i) sum.push_back(g);
        else sum[i] = sum[i] + g;
      }
    }
    auto params = master->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sum[i] / ranks;
    opt.step();
  }
  return named(*master);
}

TEST(FullyShard, MixedPrecisionEqualsItsReference) {
  constexpr int kRanks = 2;
  const auto data = batches(kWidths.front(), 29);
  const State want = train_mixed_reference(data, kRanks);
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  std::vector<State> got(kRanks);
  std::vector<::torch::ScalarType> output_types(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    FullyShardOptions options;
    options.mp_policy.param_dtype = ::torch::kBFloat16;
    options.mp_policy.reduce_dtype = ::torch::kFloat;
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), options);
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    for (const auto& [x, y] : data) {
      opt.zero_grad();
      auto out = model->forward(shard_of(x, rank, kRanks));
      output_types[static_cast<std::size_t>(rank)] = out.scalar_type();
      ::torch::mse_loss(out.to(::torch::kFloat), shard_of(y, rank, kRanks)).backward();
      for (const auto& p : model->parameters())
        if (p.grad().defined()) EXPECT_EQ(p.grad().scalar_type(), ::torch::kFloat);
      opt.step();
    }
    got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(output_types[static_cast<std::size_t>(r)], ::torch::kBFloat16);
    for (const auto& [name, t] : got[static_cast<std::size_t>(r)]) EXPECT_EQ(t.scalar_type(), ::torch::kFloat) << name;
    expect_close(got[static_cast<std::size_t>(r)], want, kRtol, "rank " + std::to_string(r));
  }
}

// ---- accumulation, clipping, evaluation -----------------------------------

TEST(FullyShard, AccumulationWithoutSyncEqualsOneProcessOnBothMicroBatches) {
  constexpr int kRanks = 2;
  const auto data = batches(kWidths.front(), 31);
  auto reference = plain_mlp();
  ::torch::optim::SGD ref_opt(reference->parameters(), ::torch::optim::SGDOptions(0.1));
  for (int s = 0; s + 1 < kSteps; s += 2) {
    ref_opt.zero_grad();
    for (int m = 0; m < 2; ++m) ::torch::mse_loss(reference->forward(data[s + m].x), data[s + m].y).backward();
    ref_opt.step();
  }
  const State want = named(*reference);
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  std::vector<State> got(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.1));
    for (int s = 0; s + 1 < kSteps; s += 2) {
      opt.zero_grad();
      for (int m = 0; m < 2; ++m) {
        model->set_requires_gradient_sync(m == 1);
        const auto& [x, y] = data[s + m];
        ::torch::mse_loss(model->forward(shard_of(x, rank, kRanks)), shard_of(y, rank, kRanks)).backward();
      }
      opt.step();
    }
    got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
  });
  for (int r = 0; r < kRanks; ++r) expect_close(got[static_cast<std::size_t>(r)], want, kRtol, "rank " + std::to_string(r));
}

TEST(FullyShard, ClippingByTheGlobalNormEqualsOneProcess) {
  constexpr int kRanks = 3;
  constexpr double kMaxNorm = 0.05;
  const auto data = batches(kWidths.front(), 37);
  auto reference = plain_mlp();
  ::torch::optim::SGD ref_opt(reference->parameters(), ::torch::optim::SGDOptions(0.1));
  std::vector<double> want_norms;
  for (const auto& [x, y] : data) {
    ref_opt.zero_grad();
    ::torch::mse_loss(reference->forward(x), y).backward();
    want_norms.push_back(::torch::nn::utils::clip_grad_norm_(reference->parameters(), kMaxNorm));
    ref_opt.step();
  }
  const State want = named(*reference);
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  std::vector<State> got(kRanks);
  std::vector<std::vector<double>> norms(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.1));
    for (const auto& [x, y] : data) {
      opt.zero_grad();
      ::torch::mse_loss(model->forward(shard_of(x, rank, kRanks)), shard_of(y, rank, kRanks)).backward();
      norms[static_cast<std::size_t>(rank)].push_back(clip_grad_norm_(*model, kMaxNorm));
      opt.step();
    }
    got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(norms[r][s], want_norms[s], want_norms[s] * 1e-5) << "rank " << r;
    expect_close(got[static_cast<std::size_t>(r)], want, kRtol, "rank " + std::to_string(r));
  }
}

TEST(FullyShard, EvaluationBetweenStepsLeavesGradientsAndShardsAsTheyWere) {
  constexpr int kRanks = 2;
  const auto data = batches(kWidths.front(), 41);
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  auto reference = plain_mlp();
  const Tensor want = reference->forward(data[0].x);
  std::vector<Tensor> outputs(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::mse_loss(model->forward(shard_of(data[0].x, rank, kRanks)), shard_of(data[0].y, rank, kRanks)).backward();
    std::vector<Tensor> before;
    for (const auto& p : model->parameters()) before.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
    {
      ::torch::NoGradGuard no_grad;
      outputs[static_cast<std::size_t>(rank)] = model->forward(data[0].x);
    }
    auto params = model->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].dim(), 1);
      ASSERT_EQ(params[i].grad().defined(), before[i].defined());
      if (before[i].defined()) EXPECT_TRUE(params[i].grad().equal(before[i]));
    }
  });
  for (const auto& out : outputs) EXPECT_TRUE(::torch::allclose(out, want, kRtol, kRtol * 0.1));
}

// ---- state dicts and checkpoints -------------------------------------------

TEST(FullyShard, FullStateDictLoadsAtAnotherWorldSize) {
  const auto data = batches(kWidths.front(), 43);
  auto plains2 = per_rank(2, [](int) { return plain_mlp(); });
  State trained;
  {
    TorchThreadWorld world(2, "shm");
    world.run([&](int rank, ProcessGroup& pg) {
      auto model = sharded_mlp(plains2[static_cast<std::size_t>(rank)], borrow(pg), {});
      ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.1));
      ::torch::mse_loss(model->forward(shard_of(data[0].x, rank, 2)), shard_of(data[0].y, rank, 2)).backward();
      opt.step();
      auto state = model->full_state_dict(0);
      if (rank == 0) trained = state;
    });
  }
  auto plains3 = per_rank(3, [](int) { return plain_mlp(); });
  std::vector<State> got(3);
  TorchThreadWorld world(3, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains3[static_cast<std::size_t>(rank)], borrow(pg), {});
    model->load_full_state_dict(trained);
    got[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
    State missing = trained;
    missing.erase(missing.begin());
    EXPECT_THROW(model->load_full_state_dict(missing), InvalidArgument);
  });
  for (const auto& state : got) expect_close(state, trained, 0, "after loading at 3 ranks");
}

TEST(FullyShard, ShardedCheckpointResumesTrainingExactly) {
  constexpr int kRanks = 2;
  const auto data = batches(kWidths.front(), 47);
  const auto dir = std::filesystem::temp_directory_path() / ("fully_shard_ckpt." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model").string();
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  auto fresh = per_rank(kRanks, [](int) { return plain_mlp(); });
  std::vector<State> straight(kRanks), resumed(kRanks);
  auto step = [&](auto& model, ::torch::optim::Optimizer& opt, int rank, int s) {
    opt.zero_grad();
    ::torch::mse_loss(model->forward(shard_of(data[s].x, rank, kRanks)), shard_of(data[s].y, rank, kRanks)).backward();
    opt.step();
  };
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::optim::Adam opt(model->parameters(), ::torch::optim::AdamOptions(0.02));
    step(model, opt, rank, 0);
    save_sharded_checkpoint(*model, path, &opt, /*steps=*/1);
    step(model, opt, rank, 1);
    straight[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);

    auto again = sharded_mlp(fresh[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::optim::Adam opt2(again->parameters(), ::torch::optim::AdamOptions(0.02));
    std::uint64_t steps = 0;
    EXPECT_TRUE(load_sharded_checkpoint(*again, path, &opt2, &steps));
    EXPECT_EQ(steps, 1u);
    step(again, opt2, rank, 1);
    resumed[static_cast<std::size_t>(rank)] = again->full_state_dict(rank);
    EXPECT_FALSE(load_sharded_checkpoint(*again, path + ".absent", &opt2));
  });
  std::filesystem::remove_all(dir);
  for (int r = 0; r < kRanks; ++r) expect_close(resumed[static_cast<std::size_t>(r)], straight[static_cast<std::size_t>(r)], 0, "resumed");
}

// Each rank replaces its own file: a save that fails on one rank (or a job
// stopped between two ranks' writes) leaves files of two steps, and the
// ranks that had written keep their previous ones. The load takes the
// newest step every rank holds, and refuses, on every rank, files with no
// step in common.
TEST(FullyShard, AFailedSaveLeavesTheStepEveryRankHolds) {
  namespace fs = std::filesystem;
  constexpr int kRanks = 2;
  const auto data = batches(kWidths.front(), 53);
  const auto dir = fs::temp_directory_path() / ("fully_shard_torn." + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "model").string();
  const auto file = [&](int rank) { return fmt::format("{}.rank{}-of-{}", path, rank, kRanks); };
  auto plains = per_rank(kRanks, [](int) { return plain_mlp(); });
  std::vector<State> at_step_5(kRanks), loaded(kRanks);
  std::vector<std::uint64_t> steps_loaded(kRanks, 0);
  std::vector<std::string> save_errors(kRanks), load_errors(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = sharded_mlp(plains[static_cast<std::size_t>(rank)], borrow(pg), {});
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.1));
    const auto step = [&](int s) {
      opt.zero_grad();
      ::torch::mse_loss(model->forward(shard_of(data[s].x, rank, kRanks)), shard_of(data[s].y, rank, kRanks))
          .backward();
      opt.step();
    };
    step(0);
    save_sharded_checkpoint(*model, path, &opt, /*steps=*/4);
    step(1);
    save_sharded_checkpoint(*model, path, &opt, /*steps=*/5);
    EXPECT_FALSE(fs::exists(file(rank) + ".previous")) << "kept after every rank saved";
    at_step_5[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
    // A directory where rank 1 keeps its previous file: its save fails
    // before it writes; rank 0's succeeds.
    if (rank == 1) fs::create_directories(file(1) + ".previous/in_the_way");
    pg.barrier()->wait();
    step(2);
    try {
      save_sharded_checkpoint(*model, path, &opt, /*steps=*/6);
    } catch (const Error& e) {
      save_errors[static_cast<std::size_t>(rank)] = e.what();
    }
    if (rank == 1) fs::remove_all(file(1) + ".previous");
    pg.barrier()->wait();
    EXPECT_TRUE(load_sharded_checkpoint(*model, path, &opt, &steps_loaded[static_cast<std::size_t>(rank)]));
    loaded[static_cast<std::size_t>(rank)] = model->full_state_dict(rank);
    pg.barrier()->wait();
    // Rank 0's previous file gone as well: no step in common.
    if (rank == 0) fs::remove(file(0) + ".previous");
    pg.barrier()->wait();
    try {
      load_sharded_checkpoint(*model, path, &opt);
    } catch (const Error& e) {
      load_errors[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  fs::remove_all(dir);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_NE(save_errors[static_cast<std::size_t>(r)].find(r == 1 ? ".previous" : "rank 1 could not save its shard"),
              std::string::npos)
        << save_errors[static_cast<std::size_t>(r)];
    EXPECT_EQ(steps_loaded[static_cast<std::size_t>(r)], 5u);
    expect_close(loaded[static_cast<std::size_t>(r)], at_step_5[static_cast<std::size_t>(r)], 0, "the step both hold");
    const std::string& error = load_errors[static_cast<std::size_t>(r)];
    EXPECT_NE(error.find("no step is saved by every rank (steps held: rank 0: 6; rank 1: 5)"), std::string::npos)
        << error;
  }
}

// ---- a rank that skips a unit -------------------------------------------------

// Three blocks of one size: without a count of each unit's own, a rank
// that skips the second would gather the third against the others' second
// and train on their parameters.
struct SkippingNetImpl : nn::Module {
  SkippingNetImpl(const std::vector<Block>& plain, std::shared_ptr<ProcessGroup> pg, bool skip_second)
      : skip_second(skip_second) {
    for (std::size_t i = 0; i < plain.size(); ++i)
      blocks.push_back(register_module("b" + std::to_string(i), fully_shard(plain[i], pg)));
  }
  Tensor forward(Tensor x) {
    for (std::size_t i = 0; i < blocks.size(); ++i)
      if (!(skip_second && i == 1)) x = blocks[i]->forward(x);
    return x;
  }
  bool skip_second;
  std::vector<std::shared_ptr<FullyShard<BlockImpl>>> blocks;
};

TEST(FullyShard, ARankThatSkipsAUnitFailsNamingTheUnit) {
  auto plains = per_rank(2, [](int) {
    std::vector<Block> blocks;
    for (int i = 0; i < 3; ++i) {
      blocks.emplace_back(8, 8);
      init_from(*blocks.back(), 3);
    }
    return blocks;
  });
  TorchThreadWorld world(2, "shm", std::chrono::seconds(20));
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    auto net = std::make_shared<SkippingNetImpl>(plains[static_cast<std::size_t>(rank)], borrow(pg), rank == 1);
    auto model = fully_shard(net, borrow(pg));
    ::torch::NoGradGuard no_grad;
    model->forward(::torch::ones({2, 8}));
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("fully_shard"), std::string::npos) << message;
      EXPECT_NE(message.find(r == 0 ? "unit b1" : "unit b2"), std::string::npos) << message;
    }
  }
}

TEST(FullyShard, AWeightTiedAcrossUnitsIsRefused) {
  auto plains = per_rank(2, [](int) {
    Block a(6, 6), b(6, 6);
    b->fc = b->replace_module("fc", a->fc);  // one Linear in both blocks
    return std::make_pair(a, b);
  });
  std::vector<std::string> messages(2);
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto& [a, b] = plains[static_cast<std::size_t>(rank)];
    // The second unit already meets the first's pieces (which differ
    // across ranks, or else the root names both owners).
    try {
      nn::Sequential net;
      net->push_back(fully_shard(a, borrow(pg)));
      net->push_back(fully_shard(b, borrow(pg)));
      fully_shard(net, borrow(pg));
    } catch (const Error& e) {
      messages[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  for (const auto& m : messages) EXPECT_NE(m.find("fc.weight"), std::string::npos) << m;
}

// ---- memory per rank ----------------------------------------------------------

// Counts the CPU memory libtorch allocates, per rank thread: each thread
// names the Usage its allocations count against (thread_local, since the
// allocator is libtorch's one process-wide hook).
struct Usage {
  std::int64_t now = 0;
  std::int64_t peak = 0;
};
thread_local Usage* counted_usage = nullptr;

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(std::size_t bytes) override { return count(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(std::size_t bytes) const override { return count(bytes); }
#endif

 private:
  struct Counted {
    c10::DataPtr inner;
    Usage* usage;
    std::int64_t bytes;
  };
  static void release(void* context) {
    auto* counted = static_cast<Counted*>(context);
    if (counted->usage) counted->usage->now -= counted->bytes;
    delete counted;
  }
  c10::DataPtr count(std::size_t bytes) const {
    c10::DataPtr inner = base_->allocate(bytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    Usage* usage = counted_usage;
    if (usage) {
      usage->now += static_cast<std::int64_t>(bytes);
      usage->peak = std::max(usage->peak, usage->now);
    }
    return {data, new Counted{std::move(inner), usage, static_cast<std::int64_t>(bytes)}, &release, device};
  }
  c10::Allocator* base_;
};

// Installs the counting allocator while it lives.
class CountAllocations {
 public:
  CountAllocations() : base_(c10::GetCPUAllocator()), counting_(base_) { c10::SetCPUAllocator(&counting_, kPriority); }
  ~CountAllocations() { c10::SetCPUAllocator(base_, kPriority); }

 private:
  static constexpr std::uint8_t kPriority = 200;
  c10::Allocator* base_;
  CountingAllocator counting_;
};

constexpr std::int64_t kWide = 96;
constexpr int kUnits = 8;

nn::Sequential wide_mlp() {
  nn::Sequential net;
  for (int i = 0; i < kUnits; ++i) net->push_back(Block(kWide, kWide));
  init_from(*net, 13);
  return net;
}

// The peak of one training step (the second: the optimizer's state exists)
// and what stays allocated after it.
struct StepMemory {
  std::int64_t peak = 0;
  std::int64_t held = 0;
};
template <typename Model>
StepMemory measure_second_step(Model& model, ::torch::optim::Optimizer& opt, const Tensor& x, const Tensor& y,
                               Usage& usage) {
  for (int step = 0; step < 2; ++step) {
    if (step == 1) usage.peak = usage.now;
    opt.zero_grad();
    ::torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
  return {usage.peak, usage.now};
}

TEST(FullyShard, MemoryPerRankFallsAsOneOverTheWorld) {
  constexpr int kRanks = 4;
  constexpr std::int64_t kBatch = 2;  // small: the step's memory is the model's
  // Declared first: tensors counted against them live until the end.
  Usage alone;
  std::vector<Usage> usages(kRanks);
  auto gen = at::detail::createCPUGenerator(53);
  const Tensor x = ::torch::randn({kBatch * kRanks, kWide}, gen), y = ::torch::randn({kBatch * kRanks, kWide}, gen);
  auto plains = per_rank(kRanks, [](int) { return wide_mlp(); });
  auto whole = wide_mlp();
  std::int64_t unit_bytes = 0, model_bytes = 0;
  for (const auto& p : whole->parameters()) model_bytes += static_cast<std::int64_t>(p.nbytes());
  for (const auto& p : whole[0]->parameters()) unit_bytes += static_cast<std::int64_t>(p.nbytes());

  CountAllocations counting;
  // One process training the whole model: parameters, gradients and Adam's
  // two moments, 4x the parameters.
  counted_usage = &alone;
  ::torch::optim::Adam whole_opt(whole->parameters(), ::torch::optim::AdamOptions(1e-3));
  alone.now = model_bytes;  // the parameters were allocated before counting began
  const StepMemory unsharded = measure_second_step(whole, whole_opt, x.narrow(0, 0, kBatch), y.narrow(0, 0, kBatch), alone);
  counted_usage = nullptr;

  std::vector<StepMemory> sharded(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    Usage& usage = usages[static_cast<std::size_t>(rank)];
    counted_usage = &usage;
    nn::Sequential net;
    for (std::size_t i = 0; i < kUnits; ++i) net->push_back(fully_shard(plains[static_cast<std::size_t>(rank)]->ptr<BlockImpl>(i), borrow(pg)));
    auto model = fully_shard(net, borrow(pg));
    ::torch::optim::Adam opt(model->parameters(), ::torch::optim::AdamOptions(1e-3));
    sharded[static_cast<std::size_t>(rank)] = measure_second_step(model, opt, shard_of(x, rank, kRanks), shard_of(y, rank, kRanks), usage);
    counted_usage = nullptr;
  });

  // Held between steps: the shards, their gradients and Adam's moments, a
  // quarter of the model's four copies, plus each unit's padding.
  const std::int64_t quarter = 4 * model_bytes / kRanks;
  // At the peak, besides, in units' parameter bytes: the unit being
  // computed and the one prefetched, the unit's unsharded gradients and
  // their flat copy, two reduce-scatters in flight (their inputs): 6; and
  // what libtorch allocates around them (autograd's and the optimizer's
  // temporaries, the activations of a batch of 2): measured 5.6 units in
  // all with PyTorch 2.x's libtorch and 7.6 with Debian's 1.13.
  const std::int64_t bound = quarter + 8 * unit_bytes + quarter / 8;
  for (int r = 0; r < kRanks; ++r) {
    const auto& m = sharded[static_cast<std::size_t>(r)];
    std::printf("rank %d: peak %lld bytes, held %lld; whole model %lld (peak %lld alone); unit %lld\n", r,
                static_cast<long long>(m.peak), static_cast<long long>(m.held), static_cast<long long>(4 * model_bytes),
                static_cast<long long>(unsharded.peak), static_cast<long long>(unit_bytes));
    EXPECT_LE(m.held, quarter + quarter / 8) << "rank " << r;
    EXPECT_LE(m.peak, bound) << "rank " << r;
    EXPECT_LT(m.peak, unsharded.peak / 2) << "rank " << r;
  }
}

}  // namespace
}  // namespace lockstep::torch
