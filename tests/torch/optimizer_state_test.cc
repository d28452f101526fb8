// broadcast_optimizer_state: what a replacement receives of its peers'
// optimizer. Rank 0 trains a few steps and changes its learning rate (as a
// scheduler would); ranks 1 and 2 have fresh optimizers, rank 2 with a
// stale state of its own. After the broadcast every rank holds rank 0's
// state tensors, step counts and options, bit for bit, and one more step
// with the same gradients leaves every rank with rank 0's parameters: for
// each optimizer libtorch ships (state tensors sent as tensors) and for a
// state that is not laid out like its parameters (sent serialized).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "optimizer_state_checks.h"
#include "thread_ranks.h"
#include "torch/optimizer_state.h"

namespace lockstep::torch {
namespace {

namespace optim = ::torch::optim;
namespace nn = ::torch::nn;
using testing::expect_same_state;
using testing::TorchThreadWorld;

constexpr int kRanks = 3;

// Gradients that differ from step to step and parameter to parameter.
void set_gradients(nn::Module& model, int step) {
  int index = 0;
  for (auto& p : model.parameters()) {
    const double scale = 0.01 * (step + 1) * (++index);
    p.mutable_grad() = ::torch::linspace(-1.0, 1.0, p.numel(), p.options()).reshape(p.sizes()) * scale;
  }
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<::torch::Tensor>)>;

struct Rank {
  nn::Sequential model;
  std::unique_ptr<optim::Optimizer> optimizer;
};

std::vector<Rank> ranks_with(const MakeOptimizer& make) {
  return testing::per_rank(kRanks, [&](int) {
    ::torch::manual_seed(7);  // the same weights on every rank
    nn::Sequential model(nn::Linear(6, 6), nn::Tanh(), nn::Linear(6, 3));
    auto optimizer = make(model->parameters());
    return Rank{model, std::move(optimizer)};
  });
}


void check_broadcast(const MakeOptimizer& make, const std::function<void(optim::Optimizer&)>& after_training = {}) {
  std::vector<Rank> ranks = ranks_with(make);
  for (int step = 0; step < 3; ++step) {
    set_gradients(*ranks[0].model, step);
    ranks[0].optimizer->step();
  }
  ranks[0].optimizer->param_groups()[0].options().set_lr(0.0125);  // a scheduler's change
  if (after_training) after_training(*ranks[0].optimizer);
  // Rank 2 holds a stale state of its own, which the broadcast replaces.
  set_gradients(*ranks[2].model, 9);
  ranks[2].optimizer->step();

  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) { broadcast_optimizer_state(pg, *ranks[rank].optimizer, 0); });

  for (int r = 1; r < kRanks; ++r) {
    const std::string what = "rank " + std::to_string(r);
    expect_same_state(*ranks[0].optimizer, *ranks[r].optimizer, what);
    EXPECT_EQ(ranks[r].optimizer->param_groups()[0].options().get_lr(), 0.0125) << what;
  }
  // Rank 2's parameters moved in its own step: start every rank from rank 0's.
  for (int r = 1; r < kRanks; ++r) {
    ::torch::NoGradGuard no_grad;
    const auto from = ranks[0].model->parameters();
    auto to = ranks[r].model->parameters();
    for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  }
  for (auto& rank : ranks) {
    set_gradients(*rank.model, 3);
    rank.optimizer->step();
  }
  for (int r = 1; r < kRanks; ++r) {
    const auto want = ranks[0].model->parameters();
    const auto got = ranks[r].model->parameters();
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(::torch::equal(want[i], got[i])) << "rank " << r << ", parameter " << i << " after one more step";
  }
}

template <typename Optimizer, typename Options>
MakeOptimizer make(Options options) {
  return [options](std::vector<::torch::Tensor> params) {
    return std::make_unique<Optimizer>(std::move(params), options);
  };
}

TEST(BroadcastOptimizerState, SGDWithMomentum) {
  check_broadcast(make<optim::SGD>(optim::SGDOptions(0.1).momentum(0.9).nesterov(true)));
}
TEST(BroadcastOptimizerState, SGDWithoutMomentumHasNoState) {
  check_broadcast(make<optim::SGD>(optim::SGDOptions(0.1)));
}
TEST(BroadcastOptimizerState, AdamWithAmsgrad) {
  check_broadcast(make<optim::Adam>(optim::AdamOptions(0.01).amsgrad(true).weight_decay(0.01)));
}
TEST(BroadcastOptimizerState, AdamW) { check_broadcast(make<optim::AdamW>(optim::AdamWOptions(0.01))); }
TEST(BroadcastOptimizerState, Adagrad) { check_broadcast(make<optim::Adagrad>(optim::AdagradOptions(0.1))); }
TEST(BroadcastOptimizerState, RMSpropCenteredWithMomentum) {
  check_broadcast(make<optim::RMSprop>(optim::RMSpropOptions(0.01).centered(true).momentum(0.5)));
}

// A state tensor laid out otherwise than its parameter (here a transposed
// view) cannot be received into a tensor made like the parameter: the whole
// state goes serialized instead, with the same result.
TEST(BroadcastOptimizerState, StateNotShapedLikeItsParameterGoesSerialized) {
  check_broadcast(make<optim::Adam>(optim::AdamOptions(0.01)), [](optim::Optimizer& adam) {
    const auto& square = adam.param_groups()[0].params()[0];  // Linear(6, 6)'s weight
    auto* state = dynamic_cast<optim::AdamParamState*>(state_of(adam, square));
    ASSERT_NE(state, nullptr);
    state->exp_avg(state->exp_avg().t().contiguous().t());
    ASSERT_FALSE(state->exp_avg().is_contiguous());
  });
}

// The state of some parameters alone (a ResilientTrainer's partition):
// theirs becomes rank 0's on every rank, and the others' stays each
// rank's own, rank 2's stale state included.
TEST(BroadcastOptimizerState, SomeParametersAlone) {
  std::vector<Rank> ranks = ranks_with(make<optim::Adam>(optim::AdamOptions(0.01)));
  set_gradients(*ranks[0].model, 0);
  ranks[0].optimizer->step();
  set_gradients(*ranks[2].model, 9);
  ranks[2].optimizer->step();
  const std::vector<std::size_t> only = {1, 3};  // the biases
  std::vector<::torch::Tensor> rank2_weight_state;
  {
    auto* state = dynamic_cast<optim::AdamParamState*>(state_of(*ranks[2].optimizer, ranks[2].model->parameters()[0]));
    ASSERT_NE(state, nullptr);
    rank2_weight_state = {state->exp_avg().clone(), state->exp_avg_sq().clone()};
  }
  TorchThreadWorld world(kRanks, "shm");
  world.run(
      [&](int rank, ProcessGroup& pg) { broadcast_optimizer_state(pg, *ranks[rank].optimizer, 0, &only); });
  for (int r = 1; r < kRanks; ++r) {
    const auto want = ranks[0].model->parameters();
    const auto got = ranks[r].model->parameters();
    for (std::size_t i : only) {
      auto* a = dynamic_cast<optim::AdamParamState*>(state_of(*ranks[0].optimizer, want[i]));
      auto* b = dynamic_cast<optim::AdamParamState*>(state_of(*ranks[r].optimizer, got[i]));
      ASSERT_TRUE(a != nullptr && b != nullptr) << "rank " << r << ", parameter " << i;
      EXPECT_TRUE(::torch::equal(a->exp_avg(), b->exp_avg()) && a->step() == b->step()) << "rank " << r << ", " << i;
    }
    // Parameters 0 and 2: rank 1 had no state and has none; rank 2 keeps its own.
    auto* weight = dynamic_cast<optim::AdamParamState*>(state_of(*ranks[r].optimizer, got[0]));
    if (r == 1) {
      EXPECT_EQ(weight, nullptr);
    } else {
      ASSERT_NE(weight, nullptr);
      EXPECT_TRUE(::torch::equal(weight->exp_avg(), rank2_weight_state[0]) &&
                  ::torch::equal(weight->exp_avg_sq(), rank2_weight_state[1]));
    }
  }
}

// To some ranks alone (a replacement fed while its peers keep theirs):
// rank 2 gets rank 0's state and options; rank 1 keeps its own stale
// state and learning rate, untouched. As tensors, and serialized.
void check_sent_to_rank_2(const MakeOptimizer& make, const std::function<void(optim::Optimizer&)>& after_training = {}) {
  std::vector<Rank> ranks = ranks_with(make);
  for (int step = 0; step < 3; ++step) {
    set_gradients(*ranks[0].model, step);
    ranks[0].optimizer->step();
  }
  ranks[0].optimizer->param_groups()[0].options().set_lr(0.0125);
  if (after_training) after_training(*ranks[0].optimizer);
  set_gradients(*ranks[1].model, 9);
  ranks[1].optimizer->step();
  std::vector<std::vector<::torch::Tensor>> rank1_before;
  for (const auto& p : ranks[1].model->parameters()) {
    std::vector<::torch::Tensor> copies;
    const auto held = state_tensors(*state_of(*ranks[1].optimizer, p));
    for (const auto& t : held->first) copies.push_back(t.defined() ? t.clone() : t);
    rank1_before.push_back(copies);
  }
  const double rank1_lr = ranks[1].optimizer->param_groups()[0].options().get_lr();

  const std::vector<int> receivers = {2};
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    broadcast_optimizer_state(pg, *ranks[rank].optimizer, 0, nullptr, &receivers);
  });

  expect_same_state(*ranks[0].optimizer, *ranks[2].optimizer, "rank 2");
  EXPECT_EQ(ranks[2].optimizer->param_groups()[0].options().get_lr(), 0.0125);
  EXPECT_EQ(ranks[1].optimizer->param_groups()[0].options().get_lr(), rank1_lr);
  const auto params = ranks[1].model->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto now = state_tensors(*state_of(*ranks[1].optimizer, params[i]))->first;
    for (std::size_t k = 0; k < now.size(); ++k)
      EXPECT_TRUE(now[k].defined() == rank1_before[i][k].defined() &&
                  (!now[k].defined() || ::torch::equal(now[k], rank1_before[i][k])))
          << "rank 1 (not a receiver), parameter " << i << ", state tensor " << k;
  }
}

TEST(BroadcastOptimizerState, ToSomeRanksAlone) { check_sent_to_rank_2(make<optim::Adam>(optim::AdamOptions(0.01))); }

TEST(BroadcastOptimizerState, ToSomeRanksAloneSerialized) {
  check_sent_to_rank_2(make<optim::Adam>(optim::AdamOptions(0.01)), [](optim::Optimizer& adam) {
    auto* state = dynamic_cast<optim::AdamParamState*>(state_of(adam, adam.param_groups()[0].params()[0]));
    ASSERT_NE(state, nullptr);
    state->exp_avg(state->exp_avg().t().contiguous().t());  // not laid out like its parameter
  });
}

// Some parameters alone go as tensors, so an optimizer libtorch does not
// ship is refused, on every rank, before anything is sent.
TEST(BroadcastOptimizerState, SomeParametersAloneNeedLibtorchsOptimizers) {
  std::vector<Rank> ranks = ranks_with(make<optim::LBFGS>(optim::LBFGSOptions(0.1)));
  const std::vector<std::size_t> only = {0};
  TorchThreadWorld world(kRanks, "shm");
  const auto errors = world.run_collecting(
      [&](int rank, ProcessGroup& pg) { broadcast_optimizer_state(pg, *ranks[rank].optimizer, 0, &only); });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)] != nullptr) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("needs one of libtorch's optimizers"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep::torch
