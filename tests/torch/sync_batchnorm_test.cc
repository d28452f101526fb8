// SyncBatchNorm on N ranks equals BatchNorm in one process over the
// concatenated global batch: the forward output, the input gradients, the
// parameter gradients (summed over ranks, as DDP's all-reduce would) and the
// running statistics; for N = 2, 3, 4 with uneven per-rank batches (one rank
// may bring none), for 1d, 2d and 3d inputs. Then DDP training of a
// converted Sequential equals one-process training, sub-groups keep their
// own statistics, and bad input gives a clear error. Ranks are threads.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <numeric>

#include "torch/thread_ranks.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/sync_batchnorm.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;
using ::torch::Tensor;

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

void expect_close(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-5) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(::torch::allclose(got, want, tol, tol)) << what << " differs by " << (got - want).abs().max().item<double>();
}

// Per-rank batch sizes, uneven on purpose.
std::vector<std::int64_t> batch_sizes(int ranks) {
  switch (ranks) {
    case 2: return {3, 6};
    case 3: return {4, 0, 7};
    default: return {2, 5, 1, 4};
  }
}

struct Shape {
  std::string name;
  std::vector<std::int64_t> per_sample;  // channels first
};

// One process: BatchNorm over the global batch, `steps` training forwards
// (each with a backward of sum(out * probe)), then one eval forward.
struct Observed {
  std::vector<Tensor> outputs, input_grads;  // per step
  Tensor weight_grad, bias_grad;             // of the last step
  Tensor running_mean, running_var, eval_output;
};

constexpr int kSteps = 2;

void run_equivalence(int ranks, const Shape& shape, c10::optional<double> momentum) {
  const auto sizes = batch_sizes(ranks);
  const std::int64_t global = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
  const std::int64_t channels = shape.per_sample[0];
  ::torch::manual_seed(11);
  std::vector<Tensor> inputs, probes;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::int64_t> full{global};
    full.insert(full.end(), shape.per_sample.begin(), shape.per_sample.end());
    inputs.push_back(::torch::randn(full) * 3 + 1.5);
    probes.push_back(::torch::randn(full));
  }
  const Tensor weight = ::torch::rand({channels}) + 0.5, bias = ::torch::randn({channels});
  Tensor eval_input = inputs[0].slice(0, 0, 3) * 0.5;

  // The reference: a BatchNorm matching the input's rank.
  Observed ref;
  {
    std::shared_ptr<nn::Module> plain;
    auto options = nn::BatchNormOptions(channels).momentum(momentum);
    std::function<Tensor(const Tensor&)> forward;
    Tensor w, b, rm, rv;
    auto adopt = [&](auto module) {
      plain = module.ptr();
      forward = [module](const Tensor& x) mutable { return module(x); };
      w = module->weight, b = module->bias, rm = module->running_mean, rv = module->running_var;
    };
    if (shape.per_sample.size() == 1) adopt(nn::BatchNorm1d(options));
    if (shape.per_sample.size() == 2) adopt(nn::BatchNorm1d(options));
    if (shape.per_sample.size() == 3) adopt(nn::BatchNorm2d(options));
    if (shape.per_sample.size() == 4) adopt(nn::BatchNorm3d(options));
    {
      ::torch::NoGradGuard no_grad;
      w.copy_(weight);
      b.copy_(bias);
    }
    for (int s = 0; s < kSteps; ++s) {
      plain->zero_grad();
      auto x = inputs[static_cast<std::size_t>(s)].clone().requires_grad_(true);
      auto out = forward(x);
      (out * probes[static_cast<std::size_t>(s)]).sum().backward();
      ref.outputs.push_back(out.detach());
      ref.input_grads.push_back(x.grad());
    }
    ref.weight_grad = w.grad().clone();
    ref.bias_grad = b.grad().clone();
    ref.running_mean = rm.clone();
    ref.running_var = rv.clone();
    plain->eval();
    ref.eval_output = forward(eval_input).detach();
  }

  TorchThreadWorld world(ranks, "shm");
  std::vector<Observed> got(static_cast<std::size_t>(ranks));
  world.run([&](int rank, ProcessGroup& pg) {
    SyncBatchNorm bn(SyncBatchNormOptions(channels).momentum(momentum).process_group(borrow(pg)));
    {
      ::torch::NoGradGuard no_grad;
      bn->weight.copy_(weight);
      bn->bias.copy_(bias);
    }
    std::int64_t begin = 0;
    for (int r = 0; r < rank; ++r) begin += sizes[static_cast<std::size_t>(r)];
    const std::int64_t end = begin + sizes[static_cast<std::size_t>(rank)];
    auto& mine = got[static_cast<std::size_t>(rank)];
    for (int s = 0; s < kSteps; ++s) {
      bn->zero_grad();
      auto x = inputs[static_cast<std::size_t>(s)].slice(0, begin, end).clone().requires_grad_(true);
      auto out = bn(x);
      (out * probes[static_cast<std::size_t>(s)].slice(0, begin, end)).sum().backward();
      mine.outputs.push_back(out.detach());
      mine.input_grads.push_back(x.grad());
    }
    mine.weight_grad = bn->weight.grad().clone();
    mine.bias_grad = bn->bias.grad().clone();
    mine.running_mean = bn->running_mean.clone();
    mine.running_var = bn->running_var.clone();
    bn->eval();
    mine.eval_output = bn(eval_input).detach();
  });

  Tensor weight_grad = ::torch::zeros_like(weight), bias_grad = ::torch::zeros_like(bias);
  std::int64_t begin = 0;
  for (int r = 0; r < ranks; ++r) {
    const auto& mine = got[static_cast<std::size_t>(r)];
    const std::int64_t end = begin + sizes[static_cast<std::size_t>(r)];
    const std::string who = "rank " + std::to_string(r);
    for (int s = 0; s < kSteps; ++s) {
      const auto i = static_cast<std::size_t>(s);
      expect_close(mine.outputs[i], ref.outputs[i].slice(0, begin, end), who + " output, step " + std::to_string(s));
      expect_close(mine.input_grads[i], ref.input_grads[i].slice(0, begin, end),
                   who + " input gradient, step " + std::to_string(s));
    }
    weight_grad += mine.weight_grad;
    bias_grad += mine.bias_grad;
    expect_close(mine.running_mean, ref.running_mean, who + " running_mean");
    expect_close(mine.running_var, ref.running_var, who + " running_var");
    expect_close(mine.eval_output, ref.eval_output, who + " eval output");
    begin = end;
  }
  expect_close(weight_grad, ref.weight_grad, "weight gradient summed over ranks", 1e-4);
  expect_close(bias_grad, ref.bias_grad, "bias gradient summed over ranks", 1e-4);
}

class Equivalence : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Equivalence, EqualsBatchNormOverTheGlobalBatch) {
  const auto [ranks, dims] = GetParam();
  const std::vector<Shape> shapes{{"1d", {3}}, {"1d_length", {3, 5}}, {"2d", {4, 3, 5}}, {"3d", {2, 3, 2, 4}}};
  run_equivalence(ranks, shapes[static_cast<std::size_t>(dims)], 0.1);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  static const char* const kNames[] = {"nc", "ncl", "nchw", "ncdhw"};
  return std::to_string(std::get<0>(info.param)) + "ranks_" + kNames[std::get<1>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Ranks, Equivalence, ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values(0, 1, 2, 3)),
                         case_name);

TEST(SyncBatchNorm, CumulativeAverageWithoutMomentum) { run_equivalence(3, {"2d", {4, 3, 5}}, c10::nullopt); }

// A Sequential convnet with BatchNorm, converted and wrapped in DDP on 2
// ranks, trains to the same parameters and running statistics as the
// unconverted one on the whole batch in one process.
nn::Sequential make_convnet() {
  ::torch::manual_seed(5);
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3)), nn::BatchNorm2d(4), nn::ReLU(),
                        nn::Conv2d(nn::Conv2dOptions(4, 6, 3)), nn::BatchNorm2d(6), nn::ReLU(), nn::Flatten(),
                        nn::Linear(6 * 4 * 4, 3));
}

std::vector<Tensor> state_of(nn::Module& m) {
  std::vector<Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (auto& b : m.buffers()) out.push_back(b.detach().clone().to(::torch::kDouble));
  return out;
}

void expect_ddp_training_equal(::torch::ScalarType type, int steps, double tolerance) {
  constexpr int kRanks = 2, kBatch = 12;
  const int kTrainSteps = steps;
  ::torch::manual_seed(3);
  std::vector<Tensor> xs, ys;
  for (int s = 0; s < kTrainSteps; ++s) {
    xs.push_back(::torch::randn({kBatch, 1, 8, 8}).to(type));
    ys.push_back(::torch::randn({kBatch, 3}).to(type));
  }
  auto reference = make_convnet();
  reference->to(type);
  {
    ::torch::optim::SGD opt(reference->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kTrainSteps; ++s) {
      opt.zero_grad();
      ::torch::mse_loss(reference->forward(xs[static_cast<std::size_t>(s)]), ys[static_cast<std::size_t>(s)]).backward();
      opt.step();
    }
  }
  const auto want = state_of(*reference);
  std::vector<nn::Sequential> nets;
  for (int r = 0; r < kRanks; ++r) {
    nets.push_back(make_convnet());
    nets.back()->to(type);
  }
  TorchThreadWorld world(kRanks, "shm");
  std::vector<std::vector<Tensor>> got(kRanks);
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = convert_sync_batchnorm(nets[static_cast<std::size_t>(rank)], borrow(pg));
    DistributedDataParallel ddp(net, borrow(pg));
    ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int s = 0; s < kTrainSteps; ++s) {
      opt.zero_grad();
      auto x = xs[static_cast<std::size_t>(s)].chunk(kRanks)[rank], y = ys[static_cast<std::size_t>(s)].chunk(kRanks)[rank];
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    got[static_cast<std::size_t>(rank)] = state_of(*net);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(got[static_cast<std::size_t>(r)].size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      expect_close(got[static_cast<std::size_t>(r)][i].to(::torch::kDouble), want[i].to(::torch::kDouble),
                   "rank " + std::to_string(r) + " tensor " + std::to_string(i), tolerance);
  }
}

TEST(SyncBatchNorm, DdpTrainingEqualsOneProcessOnTheGlobalBatch) { expect_ddp_training_equal(::torch::kFloat, 3, 1e-4); }

// In double precision over more steps: what is left of the difference is
// rounding, so any difference in the computation would show.
TEST(SyncBatchNorm, DdpTrainingEqualsOneProcessInDoublePrecision) {
  expect_ddp_training_equal(::torch::kDouble, 8, 1e-10);
}

TEST(SyncBatchNorm, SubGroupsKeepTheirOwnStatistics) {
  TorchThreadWorld world(4, "shm");
  std::vector<Tensor> means(4);
  world.run([&](int rank, ProcessGroup& pg) {
    const std::vector<int> mine = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto sub = pg.new_group(mine);
    SyncBatchNorm bn(SyncBatchNormOptions(2).momentum(1.0).process_group(sub));
    bn(::torch::full({3, 2}, static_cast<float>(rank)));  // momentum 1: running_mean = the batch mean
    means[static_cast<std::size_t>(rank)] = bn->running_mean.clone();
  });
  expect_close(means[0], ::torch::full({2}, 0.5f), "group {0,1}");
  expect_close(means[1], ::torch::full({2}, 0.5f), "group {0,1}");
  expect_close(means[2], ::torch::full({2}, 2.5f), "group {2,3}");
  expect_close(means[3], ::torch::full({2}, 2.5f), "group {2,3}");
}

TEST(SyncBatchNorm, InputWithoutBatchDimensionIsRefused) {
  SyncBatchNorm bn(4);
  try {
    bn(::torch::randn({4}));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("batch and a channel dimension"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bn(::torch::randn({8, 3})), InvalidArgument);  // 3 channels, not 4
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksIsRefused) {
  const auto inputs = testing::per_rank(2, [](int rank) { return ::torch::randn({rank == 0 ? 1 : 0, 3}); });
  TorchThreadWorld world(2, "shm");
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    SyncBatchNorm bn(SyncBatchNormOptions(3).process_group(borrow(pg)));
    bn(inputs[static_cast<std::size_t>(rank)]);
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const InvalidArgument& err) {
      EXPECT_NE(std::string(err.what()).find("1 value(s) per channel over 2 rank(s)"), std::string::npos) << err.what();
    }
  }
}

TEST(ConvertSyncBatchnorm, SequentialLayersAreReplacedSharingTheirTensors) {
  auto net = make_convnet();
  auto bn = std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(net->ptr(1));
  auto converted = convert_sync_batchnorm(net, nullptr);
  auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(converted->ptr(1));
  ASSERT_TRUE(bn && sync);
  ASSERT_TRUE(std::dynamic_pointer_cast<SyncBatchNormImpl>(converted->ptr(4)));
  EXPECT_TRUE(sync->weight.is_same(bn->weight));
  EXPECT_TRUE(sync->running_var.is_same(bn->running_var));
  EXPECT_EQ(converted->named_parameters().keys(), net->named_parameters().keys());
  EXPECT_EQ(converted->named_buffers().keys(), net->named_buffers().keys());
  // Without a group it computes what BatchNorm computes.
  auto x = ::torch::randn({5, 1, 8, 8});
  expect_close(converted->forward(x), make_convnet()->forward(x), "converted without a group");
}

struct CustomImpl : nn::Module {
  CustomImpl() { bn = register_module("bn", nn::BatchNorm2d(3)); }
  nn::BatchNorm2d bn{nullptr};
};

TEST(ConvertSyncBatchnorm, BatchNormMemberOfACustomModuleIsRefused) {
  auto m = std::make_shared<CustomImpl>();
  try {
    convert_sync_batchnorm(m, nullptr);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot replace 'bn'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::torch
