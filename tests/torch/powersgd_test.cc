// PowerSGD as DDP's comm hook, ranks as threads: at full rank (every matrix
// compressed, r = min(n, m)) the approximation is exact, so training equals
// training with the plain all-reduce; at low rank it is not, and the bytes
// sent shrink by the ratio the shapes give. Bad options are refused.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "torch/thread_ranks.h"
#include "lockstep/powersgd.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/join.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;

struct NetImpl : nn::Module {
  NetImpl() {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(1, 4, 3)));  // 4 x 9 as a matrix
    fc1 = register_module("fc1", nn::Linear(4 * 6 * 6, 48));                // 48 x 144
    fc2 = register_module("fc2", nn::Linear(48, 24));                        // 24 x 48
    fc3 = register_module("fc3", nn::Linear(24, 4));                         // 4 x 24
  }
  ::torch::Tensor forward(const ::torch::Tensor& x) {
    auto h = ::torch::relu(conv(x)).flatten(1);
    return fc3(::torch::relu(fc2(::torch::relu(fc1(h)))));
  }
  nn::Conv2d conv{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

constexpr int kSteps = 6;
constexpr int kGlobalBatch = 24;

std::vector<std::pair<::torch::Tensor, ::torch::Tensor>> make_batches() {
  ::torch::manual_seed(5);
  std::vector<std::pair<::torch::Tensor, ::torch::Tensor>> out;
  for (int s = 0; s < kSteps; ++s) out.emplace_back(::torch::randn({kGlobalBatch, 1, 8, 8}), ::torch::randn({kGlobalBatch, 4}));
  return out;
}

struct Trained {
  std::vector<::torch::Tensor> params;  // rank 0's
  CompressionStats stats;               // rank 0's hook
};

// Trains on `n` ranks; `make_hook` gives each rank its hook (null: plain).
Trained train(int n, const std::function<std::shared_ptr<CommHook>()>& make_hook, DDPOptions options = {}) {
  const auto batches = make_batches();
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < n; ++r) {
    ::torch::manual_seed(11 + r);
    models.push_back(std::make_shared<NetImpl>());
  }
  std::vector<std::shared_ptr<CommHook>> hooks;
  for (int r = 0; r < n; ++r) hooks.push_back(make_hook ? make_hook() : nullptr);
  Trained out;
  TorchThreadWorld world(n, "shm", std::chrono::seconds(30));
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = models[static_cast<std::size_t>(rank)];
    DDPOptions o = options;
    o.comm_hook = hooks[static_cast<std::size_t>(rank)];
    DistributedDataParallel<NetImpl> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), o);
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
    for (const auto& [x, y] : batches) {
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(x.chunk(n)[rank]), y.chunk(n)[rank]).backward();
      opt.step();
    }
    if (rank == 0) {
      for (auto& p : model->parameters()) out.params.push_back(p.detach().clone());
      if (auto* psgd = dynamic_cast<PowerSGDHook*>(o.comm_hook.get())) out.stats = psgd->compression_stats();
    }
  });
  return out;
}

double max_difference(const Trained& a, const Trained& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i)
    worst = std::max(worst, (a.params[i] - b.params[i]).abs().max().item<double>());
  return worst;
}

PowerSGDOptions full_rank() {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 1000;  // r = min(n, m, 1000): exact
  o.min_compression_rate = 0;          // compress every matrix, even where it does not pay
  o.start_powersgd_iter = 0;
  return o;
}

TEST(PowerSGD, AtFullRankItEqualsThePlainAllreduce) {
  const Trained plain = train(3, nullptr);
  for (int start : {0, 2}) {  // from the first step (buckets rebuilt after it), or after two
    PowerSGDOptions o = full_rank();
    o.start_powersgd_iter = static_cast<std::uint64_t>(start);
    for (bool warm : {true, false}) {
      o.warm_start = warm;
      const Trained psgd = train(3, [&] { return powersgd_hook(o); });
      EXPECT_LT(max_difference(psgd, plain), 2e-5) << "start " << start << ", warm start " << warm;
      EXPECT_GT(psgd.stats.elements_sent, 0u);
    }
  }
  const Trained batched = train(3, [] { return batched_powersgd_hook(full_rank()); });
  EXPECT_LT(max_difference(batched, plain), 2e-5) << "batched";
}

TEST(PowerSGD, SeveralBucketsAndBucketViewsAtFullRankEqualThePlainAllreduce) {
  DDPOptions o;
  o.first_bucket_mb = o.bucket_cap_mb = 0.01;
  o.gradient_as_bucket_view = true;
  const Trained plain = train(2, nullptr, o);
  EXPECT_LT(max_difference(train(2, [] { return powersgd_hook(full_rank()); }, o), plain), 2e-5);
  EXPECT_LT(max_difference(train(2, [] { return batched_powersgd_hook(full_rank()); }, o), plain), 2e-5);
}

TEST(PowerSGD, AtLowRankItSendsWhatTheShapesSay) {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 1;
  o.start_powersgd_iter = 2;
  const Trained plain = train(2, nullptr);
  const Trained psgd = train(2, [&] { return powersgd_hook(o); });
  // Every weight shrinks at least twofold at rank 1 (n m > 2 (n + m)):
  // conv 4 x 9 -> 13, fc1 48 x 144 -> 192, fc2 24 x 48 -> 72, fc3 4 x 24
  // -> 28. The biases and the reducer's flag go as they are. One bucket,
  // 4 compressed steps of 6.
  const std::uint64_t total = 4 * 9 + 4 + 48 * 144 + 48 + 24 * 48 + 24 + 4 * 24 + 4 + 1;
  const std::uint64_t sent = (13 + 192 + 72 + 28) + (4 + 48 + 24 + 4) + 1;
  EXPECT_EQ(psgd.stats.elements_before, 4 * total);
  EXPECT_EQ(psgd.stats.elements_sent, 4 * sent);
  EXPECT_NEAR(psgd.stats.ratio(), static_cast<double>(total) / sent, 1e-9);
  EXPECT_GT(max_difference(psgd, plain), 1e-4) << "rank 1 should not be exact";
  // Batched: the 8,276 gradients as a 91 x 91 matrix, sent as 2 x 91 + the flag.
  const Trained batched = train(2, [&] { return batched_powersgd_hook(o); });
  EXPECT_EQ(batched.stats.elements_sent, 4u * (2 * 91 + 1));
}

TEST(PowerSGD, ARankThatJoinedShadowsTheCompressedAllreduces) {
  // Uneven inputs with PowerSGD: the joined rank runs the hook on zeros, so
  // the three collectives per bucket line up and nobody hangs.
  PowerSGDOptions o = full_rank();
  const auto batches = make_batches();
  const auto models = testing::per_rank(2, [](int) {
    ::torch::manual_seed(3);
    return std::make_shared<NetImpl>();
  });
  TorchThreadWorld world(2, "shm", std::chrono::seconds(30));
  std::vector<std::vector<::torch::Tensor>> params(2);
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = models[static_cast<std::size_t>(rank)];
    DDPOptions d;
    d.comm_hook = powersgd_hook(o);
    DistributedDataParallel<NetImpl> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), d);
    ::torch::optim::SGD opt(model->parameters(), 0.05);
    Join join({ddp});
    for (int s = 0; s < (rank == 0 ? 2 : kSteps); ++s) {
      opt.zero_grad();
      ::torch::mse_loss(ddp.forward(batches[s].first), batches[s].second).backward();
      opt.step();
    }
    join.join();
    for (auto& p : model->parameters()) params[static_cast<std::size_t>(rank)].push_back(p.detach().clone());
  });
  for (std::size_t i = 0; i < params[0].size(); ++i) EXPECT_TRUE(params[0][i].equal(params[1][i]));
}

// The hook alone, on a bucket laid out as DDP lays it out: a 48 x 144
// weight whose gradients (sums of 8 outer products per rank, with a row of
// zeros, as a Linear layer's over a small batch with a dead unit) have rank
// far below 48, a bias, and the reducer's flag.
TEST(PowerSGD, ARankDeficientGradientIsAveragedExactlyAtFullRank) {
  const std::size_t n = 48, m = 144;
  const std::vector<ParamSpec> params{{"w", n * m, DType::f32, {48, 144}}, {"b", n, DType::f32, {48}}};
  Bucket layout;
  layout.params = {0, 1};
  layout.offsets = {0, n * m};
  layout.count = n * m + n;
  ::torch::manual_seed(9);
  std::vector<::torch::Tensor> data;
  for (int r = 0; r < 3; ++r) {
    auto u = ::torch::randn({8, static_cast<std::int64_t>(n), 1}), v = ::torch::randn({8, 1, static_cast<std::int64_t>(m)});
    u.select(1, 5).zero_();
    auto w = (u * v).sum(0).flatten();
    data.push_back(::torch::cat({w, ::torch::randn({static_cast<std::int64_t>(n)}), ::torch::zeros({1})}).contiguous());
  }
  const auto average = (data[0] + data[1] + data[2]) / 3;
  TorchThreadWorld world(3, "shm", std::chrono::seconds(30));
  world.run([&](int rank, ProcessGroup& pg) {
    auto hook = powersgd_hook(full_rank());
    auto& d = data[static_cast<std::size_t>(rank)];
    const Buffer buffer{d.data_ptr<float>(), static_cast<std::size_t>(d.numel()), DType::f32};
    hook->run(pg, GradBucket{0, buffer, true, ConstBuffer{buffer.data, buffer.count, buffer.dtype}, &layout, &params})
        ->wait();
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_LT((data[static_cast<std::size_t>(r)] - average).abs().max().item<double>(), 1e-5) << "rank " << r;
}

TEST(PowerSGD, BadOptionsAreRefusedWithAReason) {
  PowerSGDOptions o;
  o.matrix_approximation_rank = 0;
  try {
    powersgd_hook(o);
    ADD_FAILURE() << "rank 0 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("matrix_approximation_rank must be at least 1 (got 0)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(batched_powersgd_hook(o), InvalidArgument);
  o.matrix_approximation_rank = 1;
  o.min_compression_rate = -1;
  EXPECT_THROW(powersgd_hook(o), InvalidArgument);
  o.min_compression_rate = 2;
  o.orthogonalization_epsilon = -1e-8;
  EXPECT_THROW(powersgd_hook(o), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::torch
