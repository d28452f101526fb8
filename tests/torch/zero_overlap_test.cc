// ZeroRedundancyOptimizer with overlap_with_ddp and hook_with_zero_step:
// training equals DDP with the unsharded optimizer (the same hook, the same
// data), whichever schedule, bucket sizes, gradient or parameter layout,
// backend and world size, with parameter groups and a scheduler too; the
// consolidated state is the unsharded optimizer's; misuse is refused with a
// clear message. Ranks are threads (every collective has the thread world's
// deadline).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <string>

#include "torch/thread_ranks.h"
#include "zero_fixtures.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/join.h"
#include "lockstep/torch/zero.h"
#include "lockstep/torch/zero_overlap.h"
#include "torch/libtorch_version.h"

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

constexpr int kSteps = 5;

ZeroOptions overlapping() {
  ZeroOptions o;
  o.overlap_with_ddp = true;
  return o;
}

// Small buckets: several per backward (the MLP has 8 parameters).
DDPOptions small_buckets(bool gradient_as_bucket_view) {
  DDPOptions o;
  o.bucket_cap_mb = 0.0005;
  o.gradient_as_bucket_view = gradient_as_bucket_view;
  return o;
}

std::vector<Tensor> values(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

std::map<std::string, Tensor> state_of(::torch::optim::Optimizer& opt, const Tensor& p) {
  std::map<std::string, Tensor> out;
  const auto it = opt.state().find(libtorch::optimizer_state_key(p));
  if (it == opt.state().end()) return out;
  if (auto* s = dynamic_cast<::torch::optim::SGDParamState*>(it->second.get())) out["momentum_buffer"] = s->momentum_buffer();
  if (auto* s = dynamic_cast<::torch::optim::AdamParamState*>(it->second.get())) {
    out["exp_avg"] = s->exp_avg();
    out["exp_avg_sq"] = s->exp_avg_sq();
    out["step"] = ::torch::tensor(static_cast<double>(s->step()));
  }
  return out;
}

void expect_close(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& who) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(::torch::allclose(got[i], want[i], 1e-6, 1e-6))
        << who << " parameter " << i << " differs by " << (got[i] - want[i]).abs().max().item<double>();
}

// One rank's step: its chunk of the global batch through DDP.
void backward(DistributedDataParallel<nn::SequentialImpl>& ddp, int step, int rank, int ranks) {
  auto [x, y] = batch(step);
  ::torch::mse_loss(ddp.forward(x.chunk(ranks)[rank]), y.chunk(ranks)[rank]).backward();
}

// What a case varies besides ranks and optimizer.
struct Variant {
  ZeroStepSchedule schedule = ZeroStepSchedule::after_backward;
  bool gradient_as_bucket_view = false;
  bool fp16 = false;
  bool parameters_as_bucket_view = false;  // ZeRO's option
  std::string backend = "shm";  // tcp: the reductions finish on the progress thread, not inline
};
Variant variant(const std::string& name) {
  Variant v;
  if (name.find("interleaved") != std::string::npos) v.schedule = ZeroStepSchedule::interleaved;
  v.gradient_as_bucket_view = name.find("grad_view") != std::string::npos;
  v.fp16 = name.find("fp16") != std::string::npos;
  if (name.find("tcp") != std::string::npos) v.backend = "tcp";
  v.parameters_as_bucket_view = name.find("param_view") != std::string::npos;
  return v;
}
std::shared_ptr<CommHook> inner_hook(const Variant& v) { return v.fp16 ? fp16_compress_hook() : allreduce_hook(); }

std::shared_ptr<CommHook> zero_hook(const Variant& v, DistributedDataParallel<nn::SequentialImpl>& ddp,
                                    ZeroRedundancyOptimizer& zero) {
  return v.schedule == ZeroStepSchedule::interleaved ? hook_with_zero_step_interleaved(inner_hook(v), ddp, zero)
                                                     : hook_with_zero_step(inner_hook(v), ddp, zero);
}

class Equivalence : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(Equivalence, OverlappedTrainingEqualsDdpWithTheUnshardedOptimizer) {
  const int ranks = std::get<0>(GetParam());
  const Factory make = std::get<1>(GetParam()) == "sgd" ? sgd() : adam();
  const Variant v = variant(std::get<2>(GetParam()));
  batch(0);  // drawn before the rank threads

  // The reference: the same DDP and hook, each rank the unsharded optimizer.
  std::vector<Tensor> want;
  std::unique_ptr<::torch::optim::Optimizer> want_optimizer;
  {
    TorchThreadWorld world(ranks, v.backend);
    std::vector<nn::Sequential> nets;
    for (int r = 0; r < ranks; ++r) nets.push_back(make_mlp(7));
    std::vector<std::unique_ptr<::torch::optim::Optimizer>> opts(static_cast<std::size_t>(ranks));
    world.run([&](int rank, ProcessGroup& pg) {
      auto net = nets[static_cast<std::size_t>(rank)];
      DistributedDataParallel ddp(net, borrow(pg), small_buckets(v.gradient_as_bucket_view));
      ddp.register_comm_hook(inner_hook(v));
      auto opt = make(net->parameters());
      for (int s = 0; s < kSteps; ++s) {
        opt->zero_grad();
        backward(ddp, s, rank, ranks);
        opt->step();
      }
      opts[static_cast<std::size_t>(rank)] = std::move(opt);
    });
    want = values(nets[0]->parameters());
    want_optimizer = std::move(opts[0]);
  }

  std::vector<nn::Sequential> nets;
  for (int r = 0; r < ranks; ++r) nets.push_back(make_mlp(7 + r));  // DDP makes them equal
  std::vector<std::vector<Tensor>> got(static_cast<std::size_t>(ranks));
  std::vector<std::size_t> buckets(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, v.backend);
  const int to = ranks - 1;
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg), small_buckets(v.gradient_as_bucket_view));
    ZeroOptions options = overlapping();
    options.parameters_as_bucket_view = v.parameters_as_bucket_view;
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), make, options);
    ddp.register_comm_hook(zero_hook(v, ddp, zero));
    for (int s = 0; s < kSteps; ++s) {
      zero.zero_grad();
      backward(ddp, s, rank, ranks);
      zero.step();
    }
    got[static_cast<std::size_t>(rank)] = values(net->parameters());
    buckets[static_cast<std::size_t>(rank)] = ddp.bucket_layout().size();
    zero.consolidate_state_dict(to);
    if (rank != to) return;
    // The reference optimizer's state is keyed by its own net's parameters.
    const auto params = net->parameters();
    const auto& want_params = want_optimizer->param_groups()[0].params();
    ASSERT_EQ(params.size(), want_params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto g = state_of(zero.consolidated(), params[i]), w = state_of(*want_optimizer, want_params[i]);
      ASSERT_FALSE(w.empty()) << "parameter " << i;
      ASSERT_EQ(g.size(), w.size()) << "parameter " << i;
      for (const auto& [name, t] : w)
        EXPECT_TRUE(::torch::allclose(g.at(name), t, 1e-6, 1e-6)) << "parameter " << i << " " << name;
    }
  });
  EXPECT_GT(buckets[0], 2u);
  for (int r = 0; r < ranks; ++r) expect_close(got[static_cast<std::size_t>(r)], want, "rank " + std::to_string(r));
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<int, std::string, std::string>>& info) {
  return std::to_string(std::get<0>(info.param)) + "ranks_" + std::get<1>(info.param) + "_" + std::get<2>(info.param);
}

INSTANTIATE_TEST_SUITE_P(RanksOptimizersSchedules, Equivalence,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values("sgd", "adam"),
                                            ::testing::Values("after_backward", "interleaved",
                                                              "interleaved_grad_view", "after_backward_fp16",
                                                              "after_backward_tcp", "interleaved_tcp",
                                                              "interleaved_param_view")),
                         case_name);

// Two parameter groups with their own learning rates, and a StepLR on the
// sharded optimizer: each bucket's step takes the groups' current options.
std::vector<::torch::optim::OptimizerParamGroup> two_groups(const std::vector<Tensor>& params) {
  std::vector<::torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<Tensor>(params.begin(), params.begin() + 4),
                      std::make_unique<::torch::optim::SGDOptions>(::torch::optim::SGDOptions(0.05).momentum(0.9)));
  groups.emplace_back(std::vector<Tensor>(params.begin() + 4, params.end()),
                      std::make_unique<::torch::optim::SGDOptions>(::torch::optim::SGDOptions(0.02).momentum(0.5)));
  return groups;
}

class GroupsAndScheduler : public ::testing::TestWithParam<int> {};

TEST_P(GroupsAndScheduler, EachBucketStepsWithItsGroupsScheduledOptions) {
  const int ranks = GetParam();
  batch(0);
  std::vector<Tensor> want;
  {
    TorchThreadWorld world(ranks, "shm");
    std::vector<nn::Sequential> nets;
    for (int r = 0; r < ranks; ++r) nets.push_back(make_mlp(7));
    world.run([&](int rank, ProcessGroup& pg) {
      auto net = nets[static_cast<std::size_t>(rank)];
      DistributedDataParallel ddp(net, borrow(pg), small_buckets(false));
      ::torch::optim::SGD opt(two_groups(net->parameters()), ::torch::optim::SGDOptions(0.1));
      ::torch::optim::StepLR schedule(opt, /*step_size=*/2, /*gamma=*/0.5);
      for (int s = 0; s < kSteps; ++s) {
        opt.zero_grad();
        backward(ddp, s, rank, ranks);
        opt.step();
        schedule.step();
      }
    });
    want = values(nets[0]->parameters());
  }
  std::vector<nn::Sequential> nets;
  for (int r = 0; r < ranks; ++r) nets.push_back(make_mlp(7));
  std::vector<std::vector<Tensor>> got(static_cast<std::size_t>(ranks));
  TorchThreadWorld world(ranks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg), small_buckets(false));
    ZeroRedundancyOptimizer zero(two_groups(net->parameters()), borrow(pg), ::torch::optim::SGDOptions(0.1),
                                 overlapping());
    ddp.register_comm_hook(hook_with_zero_step_interleaved(allreduce_hook(), ddp, zero));
    ::torch::optim::StepLR schedule(zero, /*step_size=*/2, /*gamma=*/0.5);
    for (int s = 0; s < kSteps; ++s) {
      zero.zero_grad();
      backward(ddp, s, rank, ranks);
      zero.step();
      schedule.step();
    }
    got[static_cast<std::size_t>(rank)] = values(net->parameters());
  });
  for (int r = 0; r < ranks; ++r) expect_close(got[static_cast<std::size_t>(r)], want, "rank " + std::to_string(r));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GroupsAndScheduler, ::testing::Values(2, 3));

// Runs `fn`, which must throw InvalidArgument saying exactly `message`.
template <typename Fn>
void expect_refused(Fn fn, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "not refused; expected: " << message;
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(HookWithZeroStep, RefusesAnOptimizerBuiltWithoutOverlapWithDdp) {
  const auto nets = testing::per_rank(1, [](int) { return make_mlp(7); });
  TorchThreadWorld world(1, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), sgd());
    expect_refused([&] { hook_with_zero_step(allreduce_hook(), ddp, zero); },
                   "hook_with_zero_step: the ZeroRedundancyOptimizer was built without overlap_with_ddp; build it "
                   "with ZeroOptions{.overlap_with_ddp = true}");
  });
}

TEST(HookWithZeroStep, RefusesTheBalancedElementsPartition) {
  const auto nets = testing::per_rank(1, [](int) { return make_mlp(7); });
  TorchThreadWorld world(1, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    ZeroOptions options = overlapping();
    options.partition = ZeroPartition::balanced_elements;
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), sgd(), options);
    expect_refused([&] { hook_with_zero_step(allreduce_hook(), ddp, zero); },
                   "hook_with_zero_step: overlap_with_ddp steps whole parameters; build the ZeroRedundancyOptimizer "
                   "with ZeroPartition::by_tensor");
  });
}

TEST(HookWithZeroStep, RefusesAParameterTheDdpModuleDoesNotReduce) {
  const auto nets = testing::per_rank(1, [](int) { return make_mlp(7); });
  TorchThreadWorld world(1, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    auto params = net->parameters();
    params.push_back(::torch::zeros({3}, ::torch::requires_grad()));
    ZeroRedundancyOptimizer zero(params, borrow(pg), sgd(), overlapping());
    expect_refused([&] { hook_with_zero_step(allreduce_hook(), ddp, zero); },
                   "hook_with_zero_step: parameter 8 of the ZeroRedundancyOptimizer is not one the DDP module "
                   "reduces (a parameter of another module, or one that does not require grad), so no bucket would "
                   "step it");
  });
}

TEST(HookWithZeroStep, RefusesASecondHookForTheSameOptimizer) {
  const auto nets = testing::per_rank(1, [](int) { return make_mlp(7); });
  TorchThreadWorld world(1, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    // The form docs/torch.md shows: options, then ZeroOptions.
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), ::torch::optim::SGDOptions(0.1),
                                 {.overlap_with_ddp = true});
    ddp.register_comm_hook(hook_with_zero_step(allreduce_hook(), ddp, zero));
    expect_refused([&] { hook_with_zero_step_interleaved(allreduce_hook(), ddp, zero); },
                   "hook_with_zero_step: this ZeroRedundancyOptimizer is already stepped by another "
                   "hook_with_zero_step; make one per optimizer (and one optimizer per DDP)");
  });
}

// In overlap mode step() never does a full step: without the hook there is
// nothing for it to finish.
TEST(HookWithZeroStep, StepWithoutTheHookIsRefused) {
  batch(0);
  const auto nets = testing::per_rank(2, [](int) { return make_mlp(7); });
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), sgd(), overlapping());
    backward(ddp, 0, rank, 2);
    expect_refused([&] { zero.step(); },
                   "ZeroRedundancyOptimizer::step: built with overlap_with_ddp, its shard is stepped by DDP's comm "
                   "hook, and none is registered; call ddp.register_comm_hook(hook_with_zero_step(allreduce_hook(), "
                   "ddp, zero)) before the first forward");
  });
}

TEST(HookWithZeroStep, StepWithoutABackwardIsRefused) {
  batch(0);
  const auto nets = testing::per_rank(2, [](int) { return make_mlp(7); });
  TorchThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), sgd(), overlapping());
    ddp.register_comm_hook(hook_with_zero_step(allreduce_hook(), ddp, zero));
    backward(ddp, 0, rank, 2);
    zero.step();
    expect_refused([&] { zero.step(); },
                   "ZeroRedundancyOptimizer::step: built with overlap_with_ddp, step() only all-gathers what DDP's "
                   "comm hook stepped, but 8 of 8 parameters were in no bucket reduced since the last step(); run "
                   "the backward of the DDP module's output before each step()");
  });
}

// DDP rescales for joined ranks after the hooks ran: refused, not wrong.
TEST(HookWithZeroStep, JoinIsRefused) {
  const auto nets = testing::per_rank(1, [](int) { return make_mlp(7); });
  TorchThreadWorld world(1, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    ZeroRedundancyOptimizer zero(net->parameters(), borrow(pg), sgd(), overlapping());
    expect_refused([&] { Join join({ddp, zero}); },
                   "ZeroRedundancyOptimizer with overlap_with_ddp cannot take part in a Join (uneven inputs); build "
                   "it without overlap_with_ddp to train under Join");
  });
}

}  // namespace
}  // namespace lockstep::torch
