// Join with DistributedDataParallel: ranks with different numbers of batches
// (5, 7 and 9, and one with none) all finish, and every rank ends with the
// parameters the reference semantics give: in step t the ranks that still
// have data contribute their gradients, the ranks that joined contribute
// zeros, and the sum is divided by the initial world size (or, optionally,
// by the number of ranks still training); at the end every rank holds the
// model of the last rank to join. The reference is one process that
// computes exactly that. Ranks are threads, each with its own replica.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "torch/thread_ranks.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/join.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;

struct MlpImpl : nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", nn::Linear(8, 32));
    fc2 = register_module("fc2", nn::Linear(32, 32));
    fc3 = register_module("fc3", nn::Linear(32, 4));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return fc3(::torch::relu(fc2(::torch::relu(fc1(x.flatten(1).narrow(1, 0, 8))))));
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

// BatchNorm's running statistics are buffers: DDP broadcasts them before
// each training forward, from the highest rank still training.
struct ConvNetImpl : nn::Module {
  ConvNetImpl() {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 4, 3)));
    bn = register_module("bn", nn::BatchNorm2d(4));
    fc = register_module("fc", nn::Linear(4 * 6 * 6, 4));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return fc(::torch::relu(bn(conv(x))).flatten(1)); }
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc{nullptr};
};

constexpr int kBatch = 6;
constexpr double kLr = 0.05;

struct Case {
  std::string name;
  std::vector<int> batches;  // per rank
  JoinOptions join;
  DDPOptions ddp;
};

// Batch t of rank r (inputs 1x8x8, targets 4), made on the test thread:
// libtorch's generator is one per process.
using Batches = std::vector<std::vector<std::pair<::torch::Tensor, ::torch::Tensor>>>;
Batches make_batches(const std::vector<int>& counts) {
  Batches out(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    ::torch::manual_seed(100 + static_cast<int>(r));
    for (int t = 0; t < counts[r]; ++t)
      out[r].emplace_back(::torch::randn({kBatch, 1, 8, 8}), ::torch::randn({kBatch, 4}));
  }
  return out;
}

template <typename Model>
std::shared_ptr<Model> make_model(int seed) {
  ::torch::manual_seed(seed);
  return std::make_shared<Model>();
}

std::vector<::torch::Tensor> state_of(nn::Module& m) {
  std::vector<::torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

// The reference semantics in one process. In step t every rank that has a
// t-th batch adds the gradient of its loss / divisor. The buffers follow the
// last rank (which has the most batches): it is the broadcast's source while
// training and the last to join, so only its forwards count for them.
template <typename Model>
std::vector<::torch::Tensor> reference(const Case& c, const Batches& batches) {
  auto model = make_model<Model>(7);  // rank 0's seed: DDP starts every replica from rank 0's values
  ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(kLr).momentum(0.9));
  const int world = static_cast<int>(c.batches.size());
  const int steps = *std::max_element(c.batches.begin(), c.batches.end());
  for (int t = 0; t < steps; ++t) {
    std::vector<int> active;
    for (int r = 0; r < world; ++r)
      if (c.batches[static_cast<std::size_t>(r)] > t) active.push_back(r);
    const double divisor = c.join.divide_by_initial_world_size ? world : static_cast<double>(active.size());
    std::vector<::torch::Tensor> saved;
    for (auto& b : model->buffers()) saved.push_back(b.detach().clone());
    model->zero_grad();
    for (int r : active) {
      if (r == active.back()) {
        ::torch::NoGradGuard no_grad;
        auto buffers = model->buffers();
        for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
      }
      const auto& [x, y] = batches[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
      (::torch::mse_loss(model->forward(x), y) / divisor).backward();
    }
    opt.step();
  }
  return state_of(*model);
}

template <typename Model>
std::vector<std::vector<::torch::Tensor>> train_with_join(const Case& c, const Batches& batches) {
  const int world = static_cast<int>(c.batches.size());
  std::vector<std::shared_ptr<Model>> models;
  for (int r = 0; r < world; ++r) models.push_back(make_model<Model>(7 + r));
  TorchThreadWorld tw(world, "shm", std::chrono::seconds(30));
  std::vector<std::vector<::torch::Tensor>> out(static_cast<std::size_t>(world));
  tw.run([&](int rank, ProcessGroup& pg) {
    auto model = models[static_cast<std::size_t>(rank)];
    DistributedDataParallel<Model> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), c.ddp);
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(kLr).momentum(0.9));
    {
      Join join({ddp}, c.join);
      for (const auto& [x, y] : batches[static_cast<std::size_t>(rank)]) {
        opt.zero_grad();
        ::torch::mse_loss(ddp.forward(x), y).backward();
        opt.step();
      }
      join.join();
    }
    out[static_cast<std::size_t>(rank)] = state_of(*model);
  });
  return out;
}

template <typename Model>
void expect_reference(const Case& c) {
  const Batches batches = make_batches(c.batches);
  const auto expected = reference<Model>(c, batches);
  const auto got = train_with_join<Model>(c, batches);
  for (std::size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(::torch::allclose(got[r][i].to(::torch::kDouble), expected[i].to(::torch::kDouble), 1e-4, 1e-6))
          << c.name << ": rank " << r << ", tensor " << i << " differs by "
          << (got[r][i].to(::torch::kDouble) - expected[i].to(::torch::kDouble)).abs().max().template item<double>();
  }
}

DDPOptions small_buckets() {
  DDPOptions o;
  o.first_bucket_mb = 0.002;  // several buckets: the joined rank must shadow each, in order
  o.bucket_cap_mb = 0.002;
  return o;
}

TEST(Join, UnevenBatchesGiveTheReferenceParametersDividedByTheInitialWorldSize) {
  expect_reference<MlpImpl>({"5-7-9", {5, 7, 9}, {}, small_buckets()});
}

TEST(Join, UnevenBatchesGiveTheReferenceParametersDividedByTheRanksStillTraining) {
  JoinOptions join;
  join.divide_by_initial_world_size = false;
  expect_reference<MlpImpl>({"5-7-9 by active", {5, 7, 9}, join, small_buckets()});
}

TEST(Join, ARankWithNoBatchesAtAllShadowsFromTheStart) {
  // It joins before the bucket rebuild that follows the first step.
  expect_reference<MlpImpl>({"0-3-4", {0, 3, 4}, {}, small_buckets()});
}

TEST(Join, BucketViewsUnusedParameterSearchAndTheFp16HookShadowAlike) {
  DDPOptions o = small_buckets();
  o.gradient_as_bucket_view = true;
  o.find_unused_parameters = true;
  expect_reference<MlpImpl>({"views+unused", {5, 7, 9}, {}, o});
  DDPOptions f = small_buckets();
  f.comm_hook = fp16_compress_hook();
  const Case c{"fp16", {2, 3}, {}, f};
  const Batches batches = make_batches(c.batches);
  const auto expected = reference<MlpImpl>(c, batches);
  const auto got = train_with_join<MlpImpl>(c, batches);
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(::torch::allclose(got[0][i], expected[i], 1e-2, 1e-3)) << "fp16: tensor " << i;
}

TEST(Join, StragglerWindowsLineUpWithTheJoinedRanks) {
  // A statistics window closes every 2 steps (one allgather, shadowed too).
  DDPOptions o = small_buckets();
  o.stats_window = 2;
  expect_reference<MlpImpl>({"stats window 2", {5, 7, 9}, {}, o});
}

TEST(Join, BuffersComeFromTheHighestRankStillTrainingAndTheLastJoiner) {
  expect_reference<ConvNetImpl>({"batchnorm 5-7-9", {5, 7, 9}, {}, {}});
}

TEST(Join, ThrowOnEarlyTerminationStopsEveryRank) {
  const std::vector<int> counts{5, 7, 9};
  const Batches batches = make_batches(counts);
  std::vector<std::shared_ptr<MlpImpl>> models;
  for (int r = 0; r < 3; ++r) models.push_back(make_model<MlpImpl>(7 + r));
  std::vector<int> steps_done(3, 0);
  TorchThreadWorld tw(3, "shm", std::chrono::seconds(30));
  const auto errors = tw.run_collecting([&](int rank, ProcessGroup& pg) {
    auto model = models[static_cast<std::size_t>(rank)];
    DistributedDataParallel<MlpImpl> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    Join join({ddp}, /*enable=*/true, /*throw_on_early_termination=*/true);
    for (const auto& [x, y] : batches[static_cast<std::size_t>(rank)]) {
      ::torch::mse_loss(ddp.forward(x), y).backward();
      ++steps_done[static_cast<std::size_t>(rank)];
    }
    join.join();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r << " did not throw";
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const EarlyTerminationError& e) {
      EXPECT_NE(std::string(e.what()).find(r == 0 ? "exhausted its inputs" : "another rank exhausted"),
                std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not an EarlyTerminationError: " << e.what();
    }
    EXPECT_EQ(steps_done[static_cast<std::size_t>(r)], 5) << "rank " << r;
  }
}

TEST(Join, DisabledItChangesNothing) {
  // Even batches: with enable=false no collective is added, and the result
  // is plain DDP's (the reference with every rank active).
  JoinOptions off;
  off.enable = false;
  expect_reference<MlpImpl>({"disabled", {4, 4, 4}, off, small_buckets()});
}

TEST(Join, BadJoinablesAreRefusedWithAReason) {
  TorchThreadWorld tw(2, "shm", std::chrono::seconds(30));
  auto a = make_model<MlpImpl>(1), b = make_model<MlpImpl>(1);
  std::vector<std::string> messages(2);
  tw.run([&](int rank, ProcessGroup& pg) {
    auto model = rank == 0 ? a : b;
    DistributedDataParallel<MlpImpl> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}));
    EXPECT_THROW(Join(std::vector<std::reference_wrapper<Joinable>>{}), InvalidArgument);
    try {
      Join twice({ddp, ddp});
      ADD_FAILURE() << "a joinable listed twice was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("same object"), std::string::npos) << e.what();
    }
    Join outer({ddp});
    try {
      Join inner({ddp});
      ADD_FAILURE() << "a nested Join was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("already inside another active Join"), std::string::npos) << e.what();
    }
    outer.join();  // even inputs: every rank joins at once
  });
}

}  // namespace
}  // namespace lockstep::torch
