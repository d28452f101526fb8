// ZeroRedundancyOptimizer: N-rank DDP training with the sharded optimizer
// gives the parameters of one process training on the global batch with the
// unsharded optimizer (SGD with momentum, Adam), the consolidated state
// equals that optimizer's state, a saved unsharded state loads into the
// shards and training goes on identically, each rank holds about 1/N of
// the optimizer state, and misuse gives a clear error. Ranks are threads.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "torch/thread_ranks.h"
#include "zero_fixtures.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/zero.h"
#include "torch/libtorch_version.h"
#include "torch/zero_pieces.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;
using ::torch::Tensor;

using zero_fixtures::adam;
using zero_fixtures::batch;
using zero_fixtures::borrow;
using zero_fixtures::Factory;
using zero_fixtures::kGlobalBatch;
using zero_fixtures::make_mlp;
using zero_fixtures::sgd;

constexpr int kSteps = 4;

// The per-parameter state as named tensors (step as a tensor too).
std::map<std::string, Tensor> state_of(::torch::optim::Optimizer& opt, const Tensor& p) {
  const auto key = libtorch::optimizer_state_key(p);
  std::map<std::string, Tensor> out;
  const auto it = opt.state().find(key);
  if (it == opt.state().end()) return out;
  if (auto* s = dynamic_cast<::torch::optim::SGDParamState*>(it->second.get())) out["momentum_buffer"] = s->momentum_buffer();
  if (auto* s = dynamic_cast<::torch::optim::AdamParamState*>(it->second.get())) {
    out["exp_avg"] = s->exp_avg();
    out["exp_avg_sq"] = s->exp_avg_sq();
    out["step"] = ::torch::tensor(static_cast<double>(s->step()));
  }
  return out;
}

void expect_same_state(::torch::optim::Optimizer& got, const std::vector<Tensor>& got_params,
                       ::torch::optim::Optimizer& want, const std::vector<Tensor>& want_params) {
  ASSERT_EQ(got_params.size(), want_params.size());
  for (std::size_t i = 0; i < want_params.size(); ++i) {
    const auto g = state_of(got, got_params[i]), w = state_of(want, want_params[i]);
    ASSERT_FALSE(w.empty());
    ASSERT_EQ(g.size(), w.size()) << "parameter " << i;
    for (const auto& [name, t] : w)
      EXPECT_TRUE(::torch::allclose(g.at(name), t, 1e-5, 1e-6)) << "parameter " << i << " " << name;
  }
}

// Against the one-process reference, parameters agree to rounding: the
// ranks' averaged gradient sums in another order than the whole batch's.
// Adam divides each step by sqrt(v), so where a gradient is near zero those
// last bits move the element by a visible fraction of the learning rate
// (8e-6 after 4 steps at lr 0.01, 4 ranks); a sharding error would be of
// the order of the learning rate itself.
void expect_params(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& who,
                   double atol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(::torch::allclose(got[i], want[i], 1e-5, atol))
        << who << " parameter " << i << " differs by " << (got[i] - want[i]).abs().max().item<double>();
}

std::vector<Tensor> values(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

struct Reference {
  nn::Sequential net;
  std::unique_ptr<::torch::optim::Optimizer> opt;
};

// One process, the whole batch, the unsharded optimizer; steps [from, to).
void train_reference(Reference& ref, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto [x, y] = batch(s);
    ref.opt->zero_grad();
    ::torch::mse_loss(ref.net->forward(x), y).backward();
    ref.opt->step();
  }
}

void train_sharded(DistributedDataParallel<nn::SequentialImpl>& ddp, ZeroRedundancyOptimizer& opt, int rank,
                   int ranks, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto [x, y] = batch(s);
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(x.chunk(ranks)[rank]), y.chunk(ranks)[rank]).backward();
    opt.step();
  }
}

// The ways ZeroOptions lays out the shards, by name (for test names).
ZeroOptions zero_options(const std::string& mode) {
  ZeroOptions o;
  o.parameters_as_bucket_view = mode.find("bucket_view") != std::string::npos;
  if (mode.find("balanced") != std::string::npos) o.partition = ZeroPartition::balanced_elements;
  return o;
}
const auto kModes = ::testing::Values("by_tensor", "bucket_view", "balanced", "balanced_bucket_view");

class Equivalence : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(Equivalence, ShardedTrainingEqualsTheUnshardedOptimizer) {
  const int ranks = std::get<0>(GetParam());
  const Factory make = std::get<1>(GetParam()) == "sgd" ? sgd() : adam();
  const ZeroOptions options = zero_options(std::get<2>(GetParam()));
  Reference ref{make_mlp(7), nullptr};
  ref.opt = make(ref.net->parameters());
  train_reference(ref, 0, kSteps);

  std::vector<nn::Sequential> nets;
  for (int r = 0; r < ranks; ++r) nets.push_back(make_mlp(7 + r));  // DDP makes them equal
  std::vector<std::vector<Tensor>> params(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, "shm");
  const int to = ranks - 1;  // consolidate on the last rank, not only rank 0
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    // DDP's gradients in its buckets beside ZeRO's parameters in its own.
    DDPOptions ddp_options;
    ddp_options.gradient_as_bucket_view = options.parameters_as_bucket_view;
    DistributedDataParallel ddp(net, borrow(pg), ddp_options);
    ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), make, options);
    train_sharded(ddp, opt, rank, ranks, 0, kSteps);
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
    opt.consolidate_state_dict(to);
    if (rank == to) {
      expect_same_state(opt.consolidated(), net->parameters(), *ref.opt, ref.net->parameters());
    } else {
      EXPECT_THROW(opt.consolidated(), InvalidArgument);
    }
  });
  const double atol = std::get<1>(GetParam()) == "adam" ? 5e-5 : 1e-6;
  for (int r = 0; r < ranks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref.net->parameters()), "rank " + std::to_string(r),
                  atol);
}

INSTANTIATE_TEST_SUITE_P(RanksAndOptimizers, Equivalence,
                         ::testing::Combine(::testing::Values(2, 3, 4), ::testing::Values("sgd", "adam"), kModes),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param) + "_" +
                                  std::get<2>(info.param);
                         });

// A checkpoint written by the unsharded optimizer after 2 steps, loaded into
// the shards (and the consolidated state saved by the shards, loaded into
// an unsharded optimizer), goes on training exactly as the reference; in
// every layout (a cut tensor's state is split on load and merged on save).
class Checkpoints : public ::testing::TestWithParam<std::string> {};

TEST_P(Checkpoints, InterchangeWithTheUnshardedOptimizer) {
  constexpr int kRanks = 3;
  Reference ref{make_mlp(7), nullptr};
  ref.opt = adam()(ref.net->parameters());
  train_reference(ref, 0, 2);
  std::ostringstream saved_by_reference;
  {
    ::torch::serialize::OutputArchive archive;
    ref.opt->save(archive);
    archive.save_to(saved_by_reference);
  }
  const auto params_after_2 = values(ref.net->parameters());
  train_reference(ref, 2, kSteps);

  std::vector<nn::Sequential> nets;
  for (int r = 0; r < kRanks; ++r) nets.push_back(make_mlp(7));
  std::vector<std::vector<Tensor>> params(kRanks);
  std::string saved_by_shards;
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    {
      ::torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params_after_2.size(); ++i) net->parameters()[i].copy_(params_after_2[i]);
    }
    DistributedDataParallel ddp(net, borrow(pg));
    ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), ::torch::optim::AdamOptions(0.01),
                                zero_options(GetParam()));
    ::torch::serialize::InputArchive in;
    const std::string bytes = saved_by_reference.str();
    in.load_from(bytes.data(), bytes.size());
    opt.load(in);
    train_sharded(ddp, opt, rank, kRanks, 2, kSteps);
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
    opt.consolidate_state_dict(0);
    if (rank == 0) {
      ::torch::serialize::OutputArchive out;
      opt.save(out);
      std::ostringstream stream;
      out.save_to(stream);
      saved_by_shards = stream.str();
    }
  });
  for (int r = 0; r < kRanks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref.net->parameters()), "rank " + std::to_string(r));
  auto reloaded_net = make_mlp(7);
  auto reloaded = adam()(reloaded_net->parameters());
  ::torch::serialize::InputArchive in;
  in.load_from(saved_by_shards.data(), saved_by_shards.size());
  reloaded->load(in);
  expect_same_state(*reloaded, reloaded_net->parameters(), *ref.opt, ref.net->parameters());
}

INSTANTIATE_TEST_SUITE_P(Layouts, Checkpoints, kModes);

// Adam's state (two moments per element) of 8 x Linear(512, 512): each of 4
// ranks holds about a quarter of it; the shards together hold all of it.
TEST(ZeroRedundancyOptimizer, EachRankHoldsAboutOneNthOfTheState) {
  constexpr int kRanks = 4;
  auto make_net = [] {
    ::torch::manual_seed(1);
    nn::Sequential net;
    for (int i = 0; i < 8; ++i) net->push_back(nn::Linear(512, 512));
    return net;
  };
  auto full_net = make_net();
  auto full = adam()(full_net->parameters());
  for (auto& p : full_net->parameters()) p.mutable_grad() = ::torch::ones_like(p);
  full->step();
  const std::size_t unsharded = optimizer_state_bytes(*full);
  std::vector<std::size_t> per_rank(kRanks);
  std::vector<nn::Sequential> nets;
  for (int r = 0; r < kRanks; ++r) nets.push_back(make_net());
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    for (auto& p : net->parameters()) p.mutable_grad() = ::torch::ones_like(p);
    ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), adam());
    opt.step();
    per_rank[static_cast<std::size_t>(rank)] = optimizer_state_bytes(*opt.local_optimizer());
  });
  std::size_t total = 0, largest = 0;
  for (const auto b : per_rank) total += b, largest = std::max(largest, b);
  std::printf("Adam state, 8 x Linear(512, 512): unsharded %zu bytes; per rank of %d: %zu %zu %zu %zu (largest %.3f of it)\n",
              unsharded, kRanks, per_rank[0], per_rank[1], per_rank[2], per_rank[3],
              static_cast<double>(largest) / static_cast<double>(unsharded));
  EXPECT_EQ(total, unsharded);
  // 8 weights and 8 biases over 4 ranks: 2 of each per rank, a quarter.
  EXPECT_LE(static_cast<double>(largest), 0.2501 * static_cast<double>(unsharded));
}

TEST(ZeroRedundancyOptimizer, MisuseIsRefusedClearly) {
  const auto nets = testing::per_rank(2, [](int) { return make_mlp(1); });
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    EXPECT_THROW(ZeroRedundancyOptimizer(std::vector<Tensor>{}, borrow(pg), sgd()), InvalidArgument);
    auto net = nets[static_cast<std::size_t>(rank)];
    ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), sgd());
    try {
      opt.consolidate_state_dict(2);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 is not in the group of 2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(opt.consolidated(), InvalidArgument);  // before any consolidation
  });
}

// More ranks than parameters: some shards are empty, training still works.
TEST(ZeroRedundancyOptimizer, EmptyShardsWhenRanksOutnumberParameters) {
  constexpr int kRanks = 3;
  const auto layers = testing::per_rank(kRanks, [](int) {
    ::torch::manual_seed(3);
    return nn::Linear(nn::LinearOptions(4, 2).bias(false));  // one parameter
  });
  TorchThreadWorld world(kRanks, "shm");
  std::vector<Tensor> weights(kRanks);
  world.run([&](int rank, ProcessGroup& pg) {
    auto fc = layers[static_cast<std::size_t>(rank)];
    ZeroRedundancyOptimizer opt(fc->parameters(), borrow(pg), sgd());
    EXPECT_EQ(opt.owner(0), 0);
    EXPECT_EQ(opt.local_optimizer() != nullptr, rank == 0);
    fc->weight.mutable_grad() = ::torch::ones_like(fc->weight);
    opt.step();
    opt.consolidate_state_dict(0);
    weights[static_cast<std::size_t>(rank)] = fc->weight.detach().clone();
  });
  for (int r = 1; r < kRanks; ++r) EXPECT_TRUE(weights[static_cast<std::size_t>(r)].equal(weights[0]));
}

// ---- As a torch::optim::Optimizer -----------------------------------------

// Every rank trains on the whole batch (no DDP): the gradients are the
// reference's on every rank, so the sharded steps equal the unsharded ones.
void local_step(nn::Sequential& net, ::torch::optim::Optimizer& opt, int step) {
  auto [x, y] = batch(step);
  opt.zero_grad();
  ::torch::mse_loss(net->forward(x), y).backward();
  opt.step();
}

double lr_of(const ::torch::optim::Optimizer& opt, std::size_t group) {
  return opt.param_groups().at(group).options().get_lr();
}

// torch::optim::StepLR drives the sharded optimizer through its
// param_groups(): the learning rate each shard steps with is StepLR's, and
// the parameters follow the unsharded SGD under the same schedule.
// step(closure) returns the closure's loss.
TEST(ZeroRedundancyOptimizer, AStepLRSchedulerDrivesTheShards) {
  constexpr int kRanks = 2;
  Reference ref{make_mlp(7), nullptr};
  ref.opt = sgd()(ref.net->parameters());
  ::torch::optim::StepLR ref_schedule(*ref.opt, /*step_size=*/2, /*gamma=*/0.5);
  std::vector<double> expected_lrs;
  for (int s = 0; s < kSteps; ++s) {
    expected_lrs.push_back(lr_of(*ref.opt, 0));
    local_step(ref.net, *ref.opt, s);
    ref_schedule.step();
  }
  std::vector<nn::Sequential> nets{make_mlp(7), make_mlp(7)};
  std::vector<std::vector<Tensor>> params(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), ::torch::optim::SGDOptions(0.05).momentum(0.9));
    ::torch::optim::StepLR schedule(opt, /*step_size=*/2, /*gamma=*/0.5);
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = batch(s);
      const Tensor loss = opt.step([&] {
        opt.zero_grad();
        auto l = ::torch::mse_loss(net->forward(x), y);
        l.backward();
        return l;
      });
      EXPECT_TRUE(loss.defined() && loss.item<double>() > 0) << "step " << s;
      ASSERT_NE(opt.local_optimizer(), nullptr);
      EXPECT_EQ(lr_of(*opt.local_optimizer(), 0), expected_lrs[static_cast<std::size_t>(s)]) << "step " << s;
      schedule.step();
    }
    EXPECT_EQ(lr_of(opt, 0), lr_of(*ref.opt, 0));
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
  });
  EXPECT_LT(expected_lrs.back(), expected_lrs.front());  // the schedule did change it
  for (int r = 0; r < kRanks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref.net->parameters()), "rank " + std::to_string(r));
}

// The first layer at lr 0.1, the second at 0.01, the rest added after two
// steps at 0.5 (the last through a torch::optim::Optimizer&): each moves as
// in torch::optim::SGD with the same groups.
TEST(ZeroRedundancyOptimizer, ParameterGroupsKeepTheirOwnOptions) {
  constexpr int kRanks = 3;
  using Group = ::torch::optim::OptimizerParamGroup;
  const auto groups_of = [](nn::Sequential& net) {
    const auto p = net->parameters();  // fc1 w, b, fc2 w, b, fc3 w, b, fc4 w, b
    std::vector<Group> first;
    first.emplace_back(std::vector<Tensor>{p[0], p[1]}, std::make_unique<::torch::optim::SGDOptions>(0.1));
    first.emplace_back(std::vector<Tensor>{p[2], p[3]}, std::make_unique<::torch::optim::SGDOptions>(0.01));
    Group later(std::vector<Tensor>(p.begin() + 4, p.end()), std::make_unique<::torch::optim::SGDOptions>(0.5));
    return std::make_pair(std::move(first), std::move(later));
  };
  auto ref_net = make_mlp(7);
  auto [ref_groups, ref_later] = groups_of(ref_net);
  ::torch::optim::SGD ref_opt(ref_groups, ::torch::optim::SGDOptions(1.0));
  for (int s = 0; s < kSteps; ++s) {
    if (s == 2) ref_opt.add_param_group(ref_later);
    local_step(ref_net, ref_opt, s);
  }
  std::vector<nn::Sequential> nets{make_mlp(7), make_mlp(7), make_mlp(7)};
  std::vector<std::vector<Tensor>> params(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    auto [groups, later] = groups_of(net);
    ZeroRedundancyOptimizer opt(groups, borrow(pg), ::torch::optim::SGDOptions(1.0));
    EXPECT_EQ(opt.param_groups().size(), 2u);
    for (int s = 0; s < kSteps; ++s) {
      if (s == 2) static_cast<::torch::optim::Optimizer&>(opt).add_param_group(later);
      local_step(net, opt, s);
    }
    EXPECT_EQ(opt.param_groups().size(), 3u);
    EXPECT_EQ(opt.parameters().size(), net->parameters().size());
    if (opt.local_optimizer()) {
      EXPECT_EQ(opt.local_optimizer()->param_groups().size(), 3u);
      for (std::size_t g = 0; g < 3; ++g) EXPECT_EQ(lr_of(*opt.local_optimizer(), g), lr_of(opt, g));
    }
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
  });
  for (int r = 0; r < kRanks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref_net->parameters()), "rank " + std::to_string(r));
}

// torch::save(zero, ...) writes the consolidated state, which torch::load
// reads into the unsharded Adam and into a fresh sharded optimizer, which
// then trains on exactly as the reference. The groups' options load as the
// unsharded Adam's do (libtorch 2.x restores them, 1.13 keeps the current).
TEST(ZeroRedundancyOptimizer, SavesAndLoadsThroughTorchSaveAndLoad) {
  constexpr int kRanks = 2;
  using Group = ::torch::optim::OptimizerParamGroup;
  const auto groups_of = [](nn::Sequential& net, double lr0, double lr1) {
    const auto p = net->parameters();
    std::vector<Group> groups;
    groups.emplace_back(std::vector<Tensor>(p.begin(), p.begin() + 4), std::make_unique<::torch::optim::AdamOptions>(lr0));
    groups.emplace_back(std::vector<Tensor>(p.begin() + 4, p.end()), std::make_unique<::torch::optim::AdamOptions>(lr1));
    return groups;
  };
  auto ref_net = make_mlp(7);
  ::torch::optim::Adam ref_opt(groups_of(ref_net, 0.01, 0.02), ::torch::optim::AdamOptions(1.0));
  for (int s = 0; s < 2; ++s) local_step(ref_net, ref_opt, s);
  const auto after_2 = values(ref_net->parameters());
  // The reference's state after 2 steps, kept for comparison.
  auto ref_net_after_2 = make_mlp(7);
  ::torch::optim::Adam ref_after_2(groups_of(ref_net_after_2, 0.01, 0.02), ::torch::optim::AdamOptions(1.0));
  {
    ::torch::serialize::OutputArchive archive;
    ref_opt.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    std::istringstream in(out.str());
    ::torch::load(ref_after_2, in);
  }
  const auto ref_opt_after_2 = [&]() -> ::torch::optim::Optimizer& { return ref_after_2; };
  for (int s = 2; s < kSteps; ++s) local_step(ref_net, ref_opt, s);

  std::vector<nn::Sequential> nets{make_mlp(7), make_mlp(7)}, fresh{make_mlp(8), make_mlp(8)};
  std::vector<std::vector<Tensor>> params(kRanks);
  std::string saved;
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    ZeroRedundancyOptimizer opt(groups_of(net, 0.01, 0.02), borrow(pg), ::torch::optim::AdamOptions(1.0));
    for (int s = 0; s < 2; ++s) local_step(net, opt, s);
    opt.consolidate_state_dict(0);
    if (rank == 0) {
      std::ostringstream out;
      ::torch::save(opt, out);
      saved = out.str();
    } else {
      std::ostringstream out;
      EXPECT_THROW(::torch::save(opt, out), InvalidArgument);  // nothing consolidated here
    }
  });
  ASSERT_FALSE(saved.empty());
  auto unsharded_net = make_mlp(7);
  ::torch::optim::Adam unsharded(groups_of(unsharded_net, 0.5, 0.5), ::torch::optim::AdamOptions(1.0));
  {
    std::istringstream in(saved);
    ::torch::load(unsharded, in);
    expect_same_state(unsharded, unsharded_net->parameters(), ref_opt_after_2(), ref_net_after_2->parameters());
  }
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = fresh[static_cast<std::size_t>(rank)];
    {
      ::torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < after_2.size(); ++i) net->parameters()[i].copy_(after_2[i]);
    }
    ZeroRedundancyOptimizer loaded(groups_of(net, 0.5, 0.5), borrow(pg), ::torch::optim::AdamOptions(1.0));
    {
      std::istringstream in(saved);
      ::torch::load(loaded, in);
      EXPECT_EQ(lr_of(loaded, 0), lr_of(unsharded, 0));
      EXPECT_EQ(lr_of(loaded, 1), lr_of(unsharded, 1));
    }
    ZeroRedundancyOptimizer opt(groups_of(net, 0.01, 0.02), borrow(pg), ::torch::optim::AdamOptions(1.0));
    std::istringstream in(saved);
    ::torch::load(opt, in);
    for (int s = 2; s < kSteps; ++s) local_step(net, opt, s);
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
  });
  for (int r = 0; r < kRanks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref_net->parameters()), "rank " + std::to_string(r));
}

// ---- Layouts: parameters_as_bucket_view and ZeroPartition ----------------

// parameters_as_bucket_view changes where the parameters live, not what a
// step computes: every rank's parameters equal the default layout's bit for
// bit after every step, at 1, 2 and 3 ranks, with SGD (momentum) and Adam,
// under either partition. The parameters stay the model's tensors and share
// one buffer.
class BucketView : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(BucketView, EqualsTheDefaultLayoutBitForBit) {
  const int ranks = std::get<0>(GetParam());
  const Factory make = std::get<1>(GetParam()) == "sgd" ? sgd() : adam();
  ZeroOptions plain = zero_options(std::get<2>(GetParam())), viewed = plain;
  viewed.parameters_as_bucket_view = true;
  Reference ref{make_mlp(7), nullptr};
  ref.opt = make(ref.net->parameters());
  train_reference(ref, 0, kSteps);
  std::vector<nn::Sequential> plain_nets, viewed_nets;
  for (int r = 0; r < ranks; ++r) plain_nets.push_back(make_mlp(7)), viewed_nets.push_back(make_mlp(7));
  std::vector<std::vector<Tensor>> params(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto plain_net = plain_nets[static_cast<std::size_t>(rank)], viewed_net = viewed_nets[static_cast<std::size_t>(rank)];
    const auto model_params = viewed_net->parameters();
    ZeroRedundancyOptimizer plain_opt(plain_net->parameters(), borrow(pg), make, plain);
    ZeroRedundancyOptimizer viewed_opt(model_params, borrow(pg), make, viewed);
    for (std::size_t i = 0; i < model_params.size(); ++i) {
      EXPECT_TRUE(viewed_net->parameters()[i].is_same(model_params[i])) << "parameter " << i;
      EXPECT_TRUE(model_params[i].is_alias_of(model_params[0])) << "parameter " << i << " is not in the bucket";
    }
    for (int s = 0; s < kSteps; ++s) {
      local_step(plain_net, plain_opt, s);
      local_step(viewed_net, viewed_opt, s);
      for (std::size_t i = 0; i < model_params.size(); ++i)
        EXPECT_TRUE(viewed_net->parameters()[i].equal(plain_net->parameters()[i])) << "step " << s << " parameter " << i;
    }
    params[static_cast<std::size_t>(rank)] = values(viewed_net->parameters());
  });
  for (int r = 0; r < ranks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref.net->parameters()), "rank " + std::to_string(r));
}

INSTANTIATE_TEST_SUITE_P(RanksOptimizersPartitions, BucketView,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values("sgd", "adam"),
                                            ::testing::Values("by_tensor", "balanced")),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param) + "_" +
                                  std::get<2>(info.param);
                         });

// With by_tensor, add_param_group() moves the parameters into new buffers:
// the groups still train as torch::optim::SGD's, and every parameter is in
// the bucket.
TEST(BucketView, ParameterGroupsAddedLaterJoinTheBuffer) {
  constexpr int kRanks = 2;
  const auto split = [](nn::Sequential& net) {
    const auto p = net->parameters();
    return std::make_pair(std::vector<Tensor>(p.begin(), p.begin() + 4), std::vector<Tensor>(p.begin() + 4, p.end()));
  };
  auto ref_net = make_mlp(7);
  auto [ref_first, ref_later] = split(ref_net);
  ::torch::optim::SGD ref_opt(ref_first, ::torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    if (s == 2) ref_opt.add_param_group(::torch::optim::OptimizerParamGroup(ref_later));
    local_step(ref_net, ref_opt, s);
  }
  std::vector<nn::Sequential> nets{make_mlp(7), make_mlp(7)};
  std::vector<std::vector<Tensor>> params(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    auto [first, later] = split(net);
    ZeroOptions o;
    o.parameters_as_bucket_view = true;
    ZeroRedundancyOptimizer opt(first, borrow(pg), ::torch::optim::SGDOptions(0.1).momentum(0.9), o);
    for (int s = 0; s < kSteps; ++s) {
      if (s == 2) opt.add_param_group(::torch::optim::OptimizerParamGroup(later));
      local_step(net, opt, s);
    }
    for (const auto& p : net->parameters()) EXPECT_TRUE(p.is_alias_of(net->parameters()[0]));
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
  });
  for (int r = 0; r < kRanks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], values(ref_net->parameters()), "rank " + std::to_string(r));
}

// The balanced partition cuts at equal ranges of the end-to-end elements.
TEST(ZeroPartition, BalancedElementsCutAtEqualRanges) {
  using Piece = detail::ZeroPiece;
  const auto pieces = zero_pieces::partition_balanced({10, 1, 5}, 3);  // 16 elements: 6, 6, 4
  const std::vector<std::tuple<std::size_t, std::int64_t, std::int64_t, int>> want{
      {0, 0, 6, 0}, {0, 6, 4, 1}, {1, 0, 1, 1}, {2, 0, 1, 1}, {2, 1, 4, 2}};
  ASSERT_EQ(pieces.size(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    const Piece& p = pieces[k];
    EXPECT_EQ(std::make_tuple(p.param, p.begin, p.count, p.owner), want[k]) << "piece " << k;
  }
  // More ranks than elements, and an empty tensor: every element placed once.
  const auto few = zero_pieces::partition_balanced({2, 0}, 4);
  ASSERT_EQ(few.size(), 3u);
  EXPECT_EQ(few[0].owner, 0);
  EXPECT_EQ(few[1].owner, 1);
  EXPECT_EQ(few[2].count, 0);
}

// One Linear(1024, 1024) beside small layers: its weight is 85% of the
// elements. by_tensor (PyTorch's rule) gives it, and its Adam state, to one
// rank; balanced_elements gives each rank 1/N. Both train as the unsharded
// Adam (to 1e-6), and the balanced consolidated state is Adam's own.
nn::Sequential make_dominant(int seed) {
  ::torch::manual_seed(seed);
  return nn::Sequential(nn::Linear(1024, 1024), nn::ReLU(), nn::Linear(1024, 160), nn::ReLU(), nn::Linear(160, 128),
                        nn::ReLU(), nn::Linear(128, 10));
}

struct Shares {
  double elements = 0, state = 0;  // the largest rank's, as a fraction of the whole
};

Shares train_dominant(int ranks, ZeroPartition partition, const std::vector<Tensor>& want_params,
                      ::torch::optim::Optimizer& want_opt, const std::vector<Tensor>& want_keys,
                      const std::pair<Tensor, Tensor>& data, int steps) {
  std::vector<nn::Sequential> nets;
  for (int r = 0; r < ranks; ++r) nets.push_back(make_dominant(5));
  std::vector<std::int64_t> elements(static_cast<std::size_t>(ranks));
  std::vector<std::size_t> bytes(static_cast<std::size_t>(ranks));
  std::vector<std::vector<Tensor>> params(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    ZeroOptions o;
    o.partition = partition;
    ZeroRedundancyOptimizer opt(net->parameters(), borrow(pg), ::torch::optim::AdamOptions(1e-3), o);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      ::torch::mse_loss(net->forward(data.first), data.second).backward();
      opt.step();
    }
    ASSERT_NE(opt.local_optimizer(), nullptr);
    const auto model_params = net->parameters();
    for (const auto& group : opt.local_optimizer()->param_groups())
      for (const auto& p : group.params()) {
        elements[static_cast<std::size_t>(rank)] += p.numel();
        // A cut piece lets go of its view of the gradient after the step.
        const bool cut = std::none_of(model_params.begin(), model_params.end(), [&](const Tensor& m) { return m.is_same(p); });
        if (cut) EXPECT_FALSE(p.grad().defined());
      }
    bytes[static_cast<std::size_t>(rank)] = optimizer_state_bytes(*opt.local_optimizer());
    params[static_cast<std::size_t>(rank)] = values(net->parameters());
    opt.consolidate_state_dict(0);
    if (rank == 0) expect_same_state(opt.consolidated(), net->parameters(), want_opt, want_keys);
  });
  for (int r = 0; r < ranks; ++r)
    expect_params(params[static_cast<std::size_t>(r)], want_params, "rank " + std::to_string(r));
  std::int64_t total_elements = 0;
  std::size_t total_bytes = 0;
  for (const auto e : elements) total_elements += e;
  for (const auto b : bytes) total_bytes += b;
  EXPECT_EQ(total_bytes, optimizer_state_bytes(want_opt));
  return {static_cast<double>(*std::max_element(elements.begin(), elements.end())) / static_cast<double>(total_elements),
          static_cast<double>(*std::max_element(bytes.begin(), bytes.end())) / static_cast<double>(total_bytes)};
}

class DominantTensor : public ::testing::TestWithParam<int> {};

TEST_P(DominantTensor, BalancedElementsGiveEachRankItsShare) {
  const int ranks = GetParam();
  constexpr int kDominantSteps = 3;
  // Every rank trains on the whole batch, as the reference does, so only the
  // matmuls' summation order can part them; with intra-op threads it follows
  // how many threads each call gets, which changes when the ranks' threads
  // compete (parameter 2 once moved 1.3e-6 at lr 1e-3 under load). One
  // thread each keeps the order the reference's.
  at::set_num_threads(1);
  ::torch::manual_seed(9);
  const std::pair<Tensor, Tensor> data{::torch::randn({8, 1024}), ::torch::randn({8, 10})};
  auto ref_net = make_dominant(5);
  ::torch::optim::Adam ref_opt(ref_net->parameters(), ::torch::optim::AdamOptions(1e-3));
  for (int s = 0; s < kDominantSteps; ++s) {
    ref_opt.zero_grad();
    ::torch::mse_loss(ref_net->forward(data.first), data.second).backward();
    ref_opt.step();
  }
  const auto want = values(ref_net->parameters());
  std::int64_t total = 0;
  for (const auto& p : ref_net->parameters()) total += p.numel();
  const auto before =
      train_dominant(ranks, ZeroPartition::by_tensor, want, ref_opt, ref_net->parameters(), data, kDominantSteps);
  const auto after = train_dominant(ranks, ZeroPartition::balanced_elements, want, ref_opt, ref_net->parameters(),
                                    data, kDominantSteps);
  std::printf("Linear(1024, 1024) beside small layers (its weight %.1f%% of %lld elements), Adam, %d ranks: the "
              "largest rank holds %.3f of the elements and %.3f of Adam's state with by_tensor, %.3f and %.3f with "
              "balanced_elements\n",
              100.0 * 1024 * 1024 / static_cast<double>(total), static_cast<long long>(total), ranks, before.elements,
              before.state, after.elements, after.state);
  EXPECT_GT(before.state, 0.84);
  EXPECT_LE(after.elements, 1.0 / ranks + 1e-5);
  EXPECT_LE(after.state, 1.0 / ranks + 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DominantTensor, ::testing::Values(2, 3));

TEST(ZeroPartition, BalancedElementsRefuseWhatCannotStepCuts) {
  const auto nets = testing::per_rank(2, [](int) { return make_mlp(1); });
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    ZeroOptions o;
    o.partition = ZeroPartition::balanced_elements;
    const Factory lbfgs = [](std::vector<Tensor> p) {
      return std::make_unique<::torch::optim::LBFGS>(std::move(p), ::torch::optim::LBFGSOptions(1));
    };
    try {
      ZeroRedundancyOptimizer refused(net->parameters(), borrow(pg), lbfgs, o);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("exactly torch::optim::SGD, Adam, AdamW, Adagrad or RMSprop"),
                std::string::npos)
          << e.what();
    }
    // A factory that makes one of them is as good as its Options.
    const auto params = net->parameters();
    ZeroRedundancyOptimizer opt(std::vector<Tensor>(params.begin(), params.begin() + 4), borrow(pg), adam(), o);
    try {
      opt.add_param_group(::torch::optim::OptimizerParamGroup(std::vector<Tensor>(params.begin() + 4, params.end())));
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("add_param_group() cannot be used"), std::string::npos) << e.what();
    }
    EXPECT_EQ(opt.param_groups().size(), 1u);
  });
}

}  // namespace
}  // namespace lockstep::torch
