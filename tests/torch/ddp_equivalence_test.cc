// The core guarantee: training K steps with N ranks on shards of a global
// batch gives the same parameters as one process training on the whole
// global batch. Ranks are threads, each with its own replica (built from a
// different seed: DDP must make them equal), for an MLP and a small convnet
// with BatchNorm, across bucket layouts, bucket views, no_sync accumulation,
// unused branches, static graphs and compression hooks.
//
// The one-process reference splits the global batch into the same shards and
// accumulates their gradients (each loss divided by N): with BatchNorm that
// is the computation DDP performs (each rank normalises by its own shard),
// and without it, it equals one forward over the whole batch (tested too).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <mutex>

#include "torch/thread_ranks.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;

struct MlpImpl : nn::Module {
  explicit MlpImpl(bool with_side = false) {
    fc1 = register_module("fc1", nn::Linear(8, 32));
    fc2 = register_module("fc2", nn::Linear(32, 32));
    fc3 = register_module("fc3", nn::Linear(32, 4));
    if (with_side) side = register_module("side", nn::Linear(32, 4));  // a branch used only when asked
  }
  ::torch::Tensor forward(const ::torch::Tensor& x, bool use_side = false) {
    auto h = ::torch::relu(fc2(::torch::relu(fc1(x))));
    auto y = fc3(h);
    return use_side ? y + side(h) : y;
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, side{nullptr};
};

struct ConvNetImpl : nn::Module {
  explicit ConvNetImpl(bool /*with_side*/ = false) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 4, 3)));
    bn1 = register_module("bn1", nn::BatchNorm2d(4));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(4, 8, 3)));
    bn2 = register_module("bn2", nn::BatchNorm2d(8));
    fc = register_module("fc", nn::Linear(8 * 4 * 4, 4));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x, bool /*use_side*/ = false) {
    auto h = ::torch::relu(bn1(conv1(x)));
    h = ::torch::relu(bn2(conv2(h)));
    return fc(h.flatten(1));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Linear fc{nullptr};
};

constexpr int kGlobalBatch = 48;  // divisible by 1, 2, 3 and 4 ranks times 4 micro-batches
constexpr int kSteps = 4;

struct Case {
  std::string name;
  DDPOptions options;
  int micro_batches = 1;                       // > 1: no_sync for all but the last
  std::function<bool(int step, int rank)> side;  // whether the side branch is used
  double rtol = 1e-5;
  // Gradients dropped between steps (zero_grad(set_to_none=true), the
  // default of libtorch 2.x's optimizers) instead of zeroed in place.
  bool set_to_none = false;
};

// The global batch of step s: inputs and targets, the same on every rank.
// Made on the test's thread: libtorch's default generator is one per
// process, and thread ranks drawing from it at once would race.
std::pair<::torch::Tensor, ::torch::Tensor> global_batch(bool conv, int step) {
  ::torch::manual_seed(1000 + step);
  auto x = conv ? ::torch::randn({kGlobalBatch, 1, 8, 8}) : ::torch::randn({kGlobalBatch, 8});
  auto y = ::torch::randn({kGlobalBatch, 4});
  return {x, y};
}

template <typename Model>
std::shared_ptr<Model> make_model(int seed, bool with_side) {
  ::torch::manual_seed(seed);
  return std::make_shared<Model>(with_side);
}

std::vector<::torch::Tensor> snapshot(nn::Module& m) {
  std::vector<::torch::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// One process, the whole global batch each step, cut into `shards` pieces
// (each further into micro-batches) whose gradients are accumulated.
template <typename Model>
std::vector<::torch::Tensor> reference(bool conv, int shards, const Case& c) {
  auto model = make_model<Model>(7, c.side != nullptr);  // rank 0's seed: DDP starts everyone from rank 0's values
  ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
  const int pieces = shards * c.micro_batches;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(conv, step);
    model->zero_grad(c.set_to_none);
    for (int k = 0; k < pieces; ++k) {
      const int shard = k / c.micro_batches;
      auto xs = x.chunk(pieces)[k], ys = y.chunk(pieces)[k];
      const bool side = c.side && c.side(step, shard);
      auto loss = ::torch::mse_loss(model->forward(xs, side), ys) / pieces;
      loss.backward();
    }
    opt.step();
  }
  return snapshot(*model);
}

template <typename Model>
std::vector<std::vector<::torch::Tensor>> train_ddp(bool conv, int n, const Case& c, const std::string& backend = "shm") {
  std::vector<std::shared_ptr<Model>> models;
  for (int r = 0; r < n; ++r) models.push_back(make_model<Model>(7 + r, c.side != nullptr));  // different on purpose
  std::vector<std::pair<::torch::Tensor, ::torch::Tensor>> batches;
  for (int step = 0; step < kSteps; ++step) batches.push_back(global_batch(conv, step));
  TorchThreadWorld world(n, backend);  // "hierK": hier on pretend hosts of K ranks (thread_world.h)
  std::vector<std::vector<::torch::Tensor>> out(static_cast<std::size_t>(n));
  world.run([&](int rank, ProcessGroup& pg) {
    auto model = models[static_cast<std::size_t>(rank)];
    DistributedDataParallel<Model> ddp(model, std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), c.options);
    ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batches[static_cast<std::size_t>(step)];
      auto xs = x.chunk(n)[rank], ys = y.chunk(n)[rank];
      const bool side = c.side && c.side(step, rank);
      model->zero_grad(c.set_to_none);
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
    if (c.options.autotune_bucket_cap && n > 1) {  // chosen before the last step, and in effect
      ASSERT_TRUE(ddp.bucket_autotune().has_value());
      EXPECT_EQ(ddp.bucket_cap_mb(), static_cast<double>(ddp.bucket_autotune()->bucket_cap_bytes) / (1 << 20));
      EXPECT_EQ(ddp.bucket_autotune()->buckets, ddp.bucket_layout().size());
    }
    out[static_cast<std::size_t>(rank)] = snapshot(*model);
  });
  return out;
}

void expect_close(const std::vector<::torch::Tensor>& got, const std::vector<::torch::Tensor>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = (got[i] - want[i]).abs().max().item<double>();
    const double scale = want[i].abs().max().item<double>();
    EXPECT_TRUE(::torch::allclose(got[i], want[i], rtol, rtol * 0.1)) << what << ": parameter " << i
                                                                       << " differs by " << err << " (scale " << scale
                                                                       << ")";
  }
}

DDPOptions with(std::function<void(DDPOptions&)> f) {
  DDPOptions o;
  f(o);
  return o;
}

std::vector<Case> cases() {
  return {
      {"default_buckets", {}},
      {"one_parameter_per_bucket", with([](DDPOptions& o) { o.bucket_cap_mb = o.first_bucket_mb = 1e-9; })},
      {"one_giant_bucket", with([](DDPOptions& o) { o.bucket_cap_mb = o.first_bucket_mb = 1000; })},
      {"small_buckets_rebuilt", with([](DDPOptions& o) { o.bucket_cap_mb = o.first_bucket_mb = 0.002; })},
      {"gradient_as_bucket_view", with([](DDPOptions& o) { o.gradient_as_bucket_view = true; })},
      {"gradient_as_bucket_view_set_to_none", with([](DDPOptions& o) { o.gradient_as_bucket_view = true; }), 1,
       nullptr, 1e-5, true},
      {"bucket_view_rebuilt_set_to_none", with([](DDPOptions& o) {
         o.gradient_as_bucket_view = true;
         o.bucket_cap_mb = o.first_bucket_mb = 0.002;
       }), 1, nullptr, 1e-5, true},
      {"default_set_to_none", {}, 1, nullptr, 1e-5, true},
      {"unused_branch_some_steps_set_to_none", with([](DDPOptions& o) { o.find_unused_parameters = true; }), 1,
       [](int step, int) { return step % 2 == 1; }, 1e-5, true},
      {"unused_branch_some_ranks_set_to_none", with([](DDPOptions& o) { o.find_unused_parameters = true; }), 1,
       [](int step, int rank) { return (step + rank) % 2 == 0; }, 1e-5, true},
      {"no_sync_4_micro_batches", {}, 4},
      {"static_graph", with([](DDPOptions& o) { o.static_graph = true; })},
      // kSteps = 4: the buckets are re-planned before the last step.
      {"autotune_bucket_cap", with([](DDPOptions& o) { o.autotune_bucket_cap = true; })},
      {"autotune_from_tiny_buckets_set_to_none", with([](DDPOptions& o) {
         o.autotune_bucket_cap = true;
         o.bucket_cap_mb = o.first_bucket_mb = 0.0005;
       }), 1, nullptr, 1e-5, true},
      {"autotune_bucket_view", with([](DDPOptions& o) {
         o.autotune_bucket_cap = true;
         o.gradient_as_bucket_view = true;
         o.bucket_cap_mb = o.first_bucket_mb = 0.0005;
       })},
      {"unused_branch_some_steps", with([](DDPOptions& o) { o.find_unused_parameters = true; }), 1,
       [](int step, int) { return step % 2 == 1; }},
      {"unused_branch_some_ranks", with([](DDPOptions& o) { o.find_unused_parameters = true; }), 1,
       [](int step, int rank) { return (step + rank) % 2 == 0; }},
      {"fp16_hook", with([](DDPOptions& o) { o.comm_hook = fp16_compress_hook(); }), 1, nullptr, 2e-2},
      {"bf16_hook", with([](DDPOptions& o) { o.comm_hook = bf16_compress_hook(); }), 1, nullptr, 5e-2},
  };
}

class Equivalence : public ::testing::TestWithParam<std::tuple<bool, int, std::string>> {};

TEST_P(Equivalence, NRanksOnShardsEqualOneProcessOnTheGlobalBatch) {
  const auto [conv, n, backend] = GetParam();
  at::set_num_threads(1);
  for (const Case& c : cases()) {
    if (conv && c.side) continue;  // the convnet has no side branch
    SCOPED_TRACE(c.name);
    const auto want = conv ? reference<ConvNetImpl>(conv, n, c) : reference<MlpImpl>(conv, n, c);
    const auto got = conv ? train_ddp<ConvNetImpl>(conv, n, c, backend) : train_ddp<MlpImpl>(conv, n, c, backend);
    for (int r = 0; r < n; ++r) expect_close(got[static_cast<std::size_t>(r)], want, c.rtol, c.name + " rank " + std::to_string(r));
    // Replicas agree with each other exactly, not just closely.
    for (int r = 1; r < n; ++r)
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_TRUE(::torch::equal(got[0][i], got[static_cast<std::size_t>(r)][i])) << c.name << " rank " << r;
  }
}

std::string equivalence_name(const ::testing::TestParamInfo<Equivalence::ParamType>& info) {
  const std::string& backend = std::get<2>(info.param);
  return std::string(std::get<0>(info.param) ? "convnet_bn" : "mlp") + "_" + std::to_string(std::get<1>(info.param)) +
         "ranks" + (backend == "shm" ? "" : "_" + backend);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndRanks, Equivalence,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(std::string("shm"))),
                         equivalence_name);

// Across pretend hosts: 2 hosts x 2 ranks (hier2) and 2 hosts x 1 rank (hier1).
INSTANTIATE_TEST_SUITE_P(HierHosts, Equivalence,
                         ::testing::Values(std::make_tuple(false, 4, std::string("hier2")),
                                           std::make_tuple(true, 4, std::string("hier2")),
                                           std::make_tuple(false, 2, std::string("hier1"))),
                         equivalence_name);

TEST(Equivalence, ShardedTrainingEqualsOneForwardOverTheWholeBatch) {
  // Without BatchNorm, accumulating shards is the same as one big batch.
  at::set_num_threads(1);
  auto model = make_model<MlpImpl>(7, false);
  ::torch::optim::SGD opt(model->parameters(), ::torch::optim::SGDOptions(0.05).momentum(0.9));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(false, step);
    opt.zero_grad();
    ::torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
  const auto got = train_ddp<MlpImpl>(false, 3, Case{"whole", {}});
  expect_close(got[0], snapshot(*model), 1e-5, "one forward over the global batch");
}

}  // namespace
}  // namespace lockstep::torch
