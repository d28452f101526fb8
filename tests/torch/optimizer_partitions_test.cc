// ZeRO-1 inside a ResilientTrainer (OptimizerPartitions): three ranks, each
// keeping two of three partitions that cut a weight in the middle, step the
// same gradients as one unsharded optimizer, with two parameter groups and
// a learning rate changed halfway (as a scheduler would). For each
// optimizer that may be cut: every rank ends with the unsharded
// optimizer's parameters bit for bit; the state consolidated on rank 0 is
// the unsharded optimizer's, and a job that loads it (every rank, as after
// a restart) goes on to the same bits; each partition is kept twice and no
// rank keeps more than two partitions' share. The kill matrices
// (in_place_recovery_test, replacement_test) cover deaths.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/error.h"
#include "optimizer_state_checks.h"
#include "thread_ranks.h"
#include "torch/optimizer_partitions.h"
#include "torch/optimizer_state.h"

namespace lockstep::torch {
namespace {

namespace optim = ::torch::optim;
namespace nn = ::torch::nn;
using ::torch::Tensor;
using testing::expect_same_state;
using testing::TorchThreadWorld;

constexpr int kRanks = 3;
// 7x5 + 5 + 5x3 + 3 = 58 elements: partitions of 20, 20 and 18, the
// first weight cut at element 20.
constexpr std::int64_t kElements = 58;
constexpr std::int64_t kLargestPartition = 20;

nn::Sequential make_model() {
  ::torch::manual_seed(11);
  return nn::Sequential(nn::Linear(7, 5), nn::Tanh(), nn::Linear(5, 3));
}

// Two groups (each layer its own learning rate), from `make`'s options.
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::OptimizerParamGroup>)>;

std::unique_ptr<optim::Optimizer> optimizer_for(nn::Sequential& model, const MakeOptimizer& make) {
  std::vector<optim::OptimizerParamGroup> groups;
  groups.emplace_back(model[0]->parameters());
  groups.emplace_back(model[2]->parameters());
  auto optimizer = make(std::move(groups));
  optimizer->param_groups()[1].options().set_lr(optimizer->param_groups()[0].options().get_lr() * 0.5);
  return optimizer;
}

// Gradients that differ from step to step and parameter to parameter.
void set_gradients(nn::Module& model, int step) {
  int index = 0;
  for (auto& p : model.parameters()) {
    const double scale = 0.01 * (step + 1) * (++index);
    p.mutable_grad() = ::torch::sin(::torch::linspace(-2.0, 3.0, p.numel(), p.options()) * (step + 1))
                           .reshape(p.sizes()) * scale;
  }
}

// Step `step`'s learning rates: group 1's lowered from step 2 on.
void schedule(optim::Optimizer& optimizer, int step) {
  if (step == 2) optimizer.param_groups()[1].options().set_lr(optimizer.param_groups()[1].options().get_lr() * 0.25);
}

std::vector<Tensor> copies(nn::Module& model) {
  std::vector<Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_same_parameters(nn::Module& model, const std::vector<Tensor>& want, const std::string& what) {
  const auto got = model.parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(::torch::equal(got[i], want[i])) << what << ": parameter " << i;
}


std::string saved(optim::Optimizer& optimizer) {
  std::ostringstream out;
  ::torch::save(optimizer, out);
  return out.str();
}

void load(optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  ::torch::load(optimizer, in);
}

void check_partitions(const MakeOptimizer& make) {
  // The unsharded optimizer: 4 steps, its state saved (the checkpoint), 2 more.
  auto reference = make_model();
  auto reference_optimizer = optimizer_for(reference, make);
  for (int step = 0; step < 4; ++step) {
    schedule(*reference_optimizer, step);
    set_gradients(*reference, step);
    reference_optimizer->step();
  }
  const std::vector<Tensor> after_four = copies(*reference);
  const std::string checkpoint = saved(*reference_optimizer);
  std::vector<double> learning_rates;
  for (auto& group : reference_optimizer->param_groups()) learning_rates.push_back(group.options().get_lr());
  for (int step = 4; step < 6; ++step) {
    set_gradients(*reference, step);
    reference_optimizer->step();
  }
  const std::vector<Tensor> after_six = copies(*reference);
  const std::size_t whole_bytes = state_bytes(*reference_optimizer);
  const std::vector<int> holder = {0, 1, 2};

  // The models are made here: the generator that seeds them is the process's.
  std::vector<nn::Sequential> models = testing::per_rank(kRanks, [](int) { return make_model(); });
  std::vector<nn::Sequential> restarted_models = testing::per_rank(kRanks, [](int) { return make_model(); });
  auto loaded_model = make_model();
  std::vector<std::size_t> kept(kRanks);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    const std::string what = "rank " + std::to_string(rank);
    // A first start: fresh optimizers, the partitions placed, 4 steps.
    auto& model = models[static_cast<std::size_t>(rank)];
    auto optimizer = optimizer_for(model, make);
    {
      OptimizerPartitions partitions(*optimizer, kRanks, /*backup=*/true, /*keeps_state=*/true);
      partitions.place(pg, holder);
      for (int step = 0; step < 4; ++step) {
        schedule(*optimizer, step);
        set_gradients(*model, step);
        partitions.step();
        partitions.share_parameters(pg);
      }
      expect_same_parameters(*model, after_four, what + " after 4 steps");
      kept[static_cast<std::size_t>(rank)] = partitions.kept_state_bytes();
      EXPECT_TRUE(optimizer->state().empty()) << what << ": the user's optimizer holds state while sharded";
      partitions.consolidate(pg, 0);
      if (rank == 0) {
        auto loaded = optimizer_for(loaded_model, make);
        load(*loaded, checkpoint);
        expect_same_state(*optimizer, *loaded, "the state consolidated on rank 0");
      }
    }
    // A restart: every rank loads the checkpoint into a new optimizer.
    auto& restarted = restarted_models[static_cast<std::size_t>(rank)];
    {
      ::torch::NoGradGuard no_grad;
      const auto to = restarted->parameters();
      for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(after_four[i]);
    }
    auto restarted_optimizer = optimizer_for(restarted, make);
    load(*restarted_optimizer, checkpoint);
    for (std::size_t g = 0; g < learning_rates.size(); ++g)  // libtorch 1.13 does not load them
      restarted_optimizer->param_groups()[g].options().set_lr(learning_rates[g]);
    OptimizerPartitions partitions(*restarted_optimizer, kRanks, /*backup=*/true, /*keeps_state=*/true);
    partitions.place(pg, holder);
    for (int step = 4; step < 6; ++step) {
      set_gradients(*restarted, step);
      partitions.step();
      partitions.share_parameters(pg);
    }
    expect_same_parameters(*restarted, after_six, what + " after the restart and 2 more steps");
  });
  std::size_t sum = 0;
  for (int r = 0; r < kRanks; ++r) {
    sum += kept[static_cast<std::size_t>(r)];
    // Its partition and its predecessor's: at most twice the largest.
    EXPECT_LE(kept[static_cast<std::size_t>(r)] * kElements, 2 * kLargestPartition * whole_bytes) << "rank " << r;
  }
  EXPECT_EQ(sum, 2 * whole_bytes) << "every partition kept twice";
}

template <typename Optimizer, typename Options>
MakeOptimizer make(Options options) {
  return [options](std::vector<optim::OptimizerParamGroup> groups) {
    return std::make_unique<Optimizer>(std::move(groups), options);
  };
}

TEST(OptimizerPartitions, SGDWithMomentum) {
  check_partitions(make<optim::SGD>(optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)));
}
TEST(OptimizerPartitions, AdamWithAmsgrad) {
  check_partitions(make<optim::Adam>(optim::AdamOptions(0.01).amsgrad(true).weight_decay(0.01)));
}
TEST(OptimizerPartitions, AdamW) { check_partitions(make<optim::AdamW>(optim::AdamWOptions(0.01))); }
TEST(OptimizerPartitions, Adagrad) { check_partitions(make<optim::Adagrad>(optim::AdagradOptions(0.1))); }
TEST(OptimizerPartitions, RMSpropCenteredWithMomentum) {
  check_partitions(make<optim::RMSprop>(optim::RMSpropOptions(0.01).centered(true).momentum(0.5)));
}

// A subclass could look at whole tensors in its step(): it may not be cut.
struct ClippedSGD : optim::SGD {
  using optim::SGD::SGD;
};

TEST(OptimizerPartitions, RefusesAnOptimizerThatMayNotBeCut) {
  auto model = make_model();
  ClippedSGD sgd(model->parameters(), optim::SGDOptions(0.1));
  try {
    OptimizerPartitions(sgd, kRanks, true, true);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a subclass"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::torch
