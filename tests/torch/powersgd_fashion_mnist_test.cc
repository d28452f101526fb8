// PowerSGD on real data: an MLP (784-256-128-10) trained for 2 epochs on
// the whole Fashion-MNIST training set by 2 ranks (threads), with the plain
// all-reduce and with PowerSGD at rank 2 (error feedback, warm start), from
// the same seeds: PowerSGD's mean test accuracy is within 1.75 points of
// the plain run's while it sends 1/67 of the gradients. Skipped without
// the dataset.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>

#include "fashion_mnist/dataset.h"
#include "torch/thread_ranks.h"
#include "lockstep/powersgd.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";
constexpr int kRanks = 2;
constexpr int kEpochs = 2;
constexpr int kBatchPerRank = 64;

struct MlpImpl : nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", nn::Linear(784, 256));
    fc2 = register_module("fc2", nn::Linear(256, 128));
    fc3 = register_module("fc3", nn::Linear(128, 10));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    return fc3(::torch::relu(fc2(::torch::relu(fc1(x.flatten(1))))));
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct Split {
  ::torch::Tensor images, labels;
};

Split load(bool train) {
  fashion_mnist::Dataset data(kData, train);
  const auto n = *data.size();
  std::vector<::torch::Tensor> images, labels;
  for (std::size_t i = 0; i < n; ++i) {
    auto example = data.get(i);
    images.push_back(example.data);
    labels.push_back(example.target);
  }
  return {::torch::stack(images), ::torch::stack(labels)};
}

struct Result {
  double accuracy = 0;  // percent, on the whole test set
  CompressionStats stats;
};

Result train_and_test(const Split& train, const Split& test, std::shared_ptr<CommHook> (*make_hook)(), std::uint64_t seed) {
  // The epochs' shuffles and the initial weights, drawn here: ranks share
  // one generator otherwise.
  std::vector<::torch::Tensor> orders;
  ::torch::manual_seed(seed);
  for (int e = 0; e < kEpochs; ++e) orders.push_back(::torch::randperm(train.images.size(0)));
  std::vector<std::shared_ptr<MlpImpl>> models;
  for (int r = 0; r < kRanks; ++r) models.push_back(std::make_shared<MlpImpl>());
  Result result;
  TorchThreadWorld world(kRanks, "shm", std::chrono::seconds(60));
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = models[static_cast<std::size_t>(rank)];
    DDPOptions options;
    options.comm_hook = make_hook ? make_hook() : nullptr;
    DistributedDataParallel<MlpImpl> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), options);
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
    const std::int64_t global = kBatchPerRank * kRanks;
    for (int e = 0; e < kEpochs; ++e) {
      const auto& order = orders[static_cast<std::size_t>(e)];
      for (std::int64_t start = 0; start + global <= order.size(0); start += global) {
        auto mine = order.slice(0, start + rank * kBatchPerRank, start + (rank + 1) * kBatchPerRank);
        opt.zero_grad();
        ::torch::cross_entropy_loss(ddp.forward(train.images.index_select(0, mine)), train.labels.index_select(0, mine))
            .backward();
        opt.step();
      }
    }
    if (rank != 0) return;
    ::torch::NoGradGuard no_grad;
    model->eval();
    const auto predicted = model->forward(test.images).argmax(1);
    result.accuracy = 100.0 * predicted.eq(test.labels).sum().item<double>() / static_cast<double>(test.labels.size(0));
    if (auto* psgd = dynamic_cast<PowerSGDHook*>(options.comm_hook.get())) result.stats = psgd->compression_stats();
  });
  return result;
}

std::shared_ptr<CommHook> rank2_powersgd() {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 2;
  o.start_powersgd_iter = 10;
  return powersgd_hook(o);
}

TEST(PowerSGDFashionMnist, AtRank2FiveSeedsAverageWithinOneAndThreeQuarterPointsOfPlain) {
  if (!std::filesystem::exists(std::string(kData) + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (make test installs it)";
  ::torch::set_num_threads(1);  // one core per rank thread
  const Split train = load(true), test = load(false);
  // PowerSGD at rank 2 costs about a point here, on either libtorch: over
  // seeds 1-10 the plain runs average 86.17% on both Debian's 1.13 and
  // PyTorch 2.11, PowerSGD 85.22% and 85.16% (gaps 0.95 and 1.01 points;
  // single seeds from -0.01 to 1.80). One seed decides nothing (seed 1's gap
  // is 0.32 on 1.13 and 0.95 on 2.11, 2.05 on a Xeon with 2.11), so the test
  // compares the means of five seeds: their standard error (a single
  // seed's gap varies by 0.4-0.6 points) is about a quarter point, so a true
  // gap of one point stays under 1.75 (seeds 1-5 here: 0.71 on 1.13, 1.10
  // on 2.11) and a PowerSGD that lost its error feedback does not (4.73
  // points below on 2.11).
  constexpr int kSeeds = 5;
  double plain_sum = 0, psgd_sum = 0;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    const Result plain = train_and_test(train, test, nullptr, seed);
    const Result psgd = train_and_test(train, test, &rank2_powersgd, seed);
    std::printf("seed %d: test accuracy plain all-reduce %.2f%%, PowerSGD rank 2 %.2f%% (compression ratio %.1f)\n",
                seed, plain.accuracy, psgd.accuracy, psgd.stats.ratio());
    EXPECT_GT(plain.accuracy, 80.0) << "seed " << seed;
    EXPECT_GT(psgd.accuracy, 80.0) << "seed " << seed;
    EXPECT_GT(psgd.stats.ratio(), 50.0) << "seed " << seed;
    plain_sum += plain.accuracy;
    psgd_sum += psgd.accuracy;
  }
  const double plain_mean = plain_sum / kSeeds, psgd_mean = psgd_sum / kSeeds;
  std::printf("mean of %d seeds: plain %.2f%%, PowerSGD rank 2 %.2f%% (%.2f points below)\n", kSeeds, plain_mean,
              psgd_mean, plain_mean - psgd_mean);
  EXPECT_LT(plain_mean - psgd_mean, 1.75);
}

}  // namespace
}  // namespace lockstep::torch
