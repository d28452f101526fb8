// DistributedDataParallel::register_comm_hook after construction, as in
// PyTorch: a hook registered so trains exactly as the same hook given in
// DDPOptions; PyTorch's (state, hook) form runs the function with its state;
// a second registration, one after a hook came with the options, and one
// after the first forward are refused naming the cause; every built-in hook
// and PyTorch's PowerSGD spellings are reachable from lockstep::torch.
// Ranks are threads.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <atomic>

#include "torch/thread_ranks.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;

constexpr int kRanks = 2;
constexpr int kSteps = 3;

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

nn::Sequential make_mlp() {
  ::torch::manual_seed(3);
  return nn::Sequential(nn::Linear(6, 16), nn::ReLU(), nn::Linear(16, 12), nn::ReLU(), nn::Linear(12, 2));
}

std::pair<::torch::Tensor, ::torch::Tensor> batch(int rank, int step) {
  const auto x = ::torch::linspace(-1, 1, 4 * 6).reshape({4, 6}) * (1 + rank) + step;
  return {x, x.narrow(1, 0, 2).sin()};
}

// Trains kSteps on each rank; `setup` may register a hook on the DDP
// before training. Returns rank 0's parameters.
std::vector<::torch::Tensor> train(const std::function<DDPOptions()>& options,
                                   const std::function<void(DistributedDataParallel<nn::SequentialImpl>&)>& setup) {
  TorchThreadWorld world(kRanks, "shm");
  std::vector<::torch::Tensor> out;
  std::vector<nn::Sequential> nets;
  for (int r = 0; r < kRanks; ++r) nets.push_back(make_mlp());
  world.run([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg), options());
    setup(ddp);
    ::torch::optim::SGD opt(net->parameters(), 0.1);
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad();
      const auto [x, y] = batch(rank, s);
      ::torch::mse_loss(ddp.forward(x), y).backward();
      opt.step();
    }
    if (rank == 0)
      for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  });
  return out;
}

void expect_equal(const std::vector<::torch::Tensor>& got, const std::vector<::torch::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].equal(want[i])) << "parameter " << i;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(RegisterCommHook, TrainsAsTheSameHookGivenAtConstruction) {
  const auto given = train(
      [] {
        DDPOptions o;
        o.comm_hook = fp16_compress_hook();
        return o;
      },
      [](auto&) {});
  const auto registered = train([] { return DDPOptions{}; },
                                [](auto& ddp) { ddp.register_comm_hook(fp16_compress_hook()); });
  const auto plain = train([] { return DDPOptions{}; }, [](auto&) {});
  expect_equal(registered, given);
  // And the hook did run: fp16 rounding moves the result off the plain average.
  bool differs = false;
  for (std::size_t i = 0; i < plain.size(); ++i) differs = differs || !plain[i].equal(given[i]);
  EXPECT_TRUE(differs);
}

TEST(RegisterCommHook, StateAndFunctionFormRunsTheFunctionWithItsState) {
  std::vector<int> calls(kRanks, 0);
  std::atomic<int> rank_counter{0};
  const auto with_function = train([] { return DDPOptions{}; }, [&](auto& ddp) {
    const int rank = ddp.reducer().group().rank();
    ddp.register_comm_hook(&calls[static_cast<std::size_t>(rank)],
                           [](int* counter, ProcessGroup& pg, const GradBucket& bucket) {
                             ++*counter;
                             return pg.allreduce(bucket.buffer, ReduceOp::avg);
                           });
    ++rank_counter;
  });
  const auto plain = train([] { return DDPOptions{}; }, [](auto&) {});
  EXPECT_EQ(rank_counter.load(), kRanks);
  for (std::size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(::torch::allclose(with_function[i], plain[i], 1e-6, 1e-7)) << "parameter " << i;
  // One bucket (the model is small): one call per step on each rank.
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(calls[static_cast<std::size_t>(r)], kSteps) << "rank " << r;
}

TEST(RegisterCommHook, IsRefusedASecondTimeAfterTheOptionsHookAndAfterTheFirstForward) {
  // Three models per rank, one per case below.
  const auto nets = testing::per_rank(kRanks, [](int) { return std::vector{make_mlp(), make_mlp(), make_mlp()}; });
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    {
      auto net = nets[static_cast<std::size_t>(rank)][0];
      DistributedDataParallel ddp(net, borrow(pg));
      ddp.register_comm_hook(bf16_compress_hook());
      const std::string again = message_of([&] { ddp.register_comm_hook(fp16_compress_hook()); });
      EXPECT_NE(again.find("already registered (bf16_compress, by an earlier register_comm_hook)"), std::string::npos)
          << again;
    }
    {
      auto net = nets[static_cast<std::size_t>(rank)][1];
      DDPOptions o;
      o.comm_hook = fp16_compress_hook();
      DistributedDataParallel ddp(net, borrow(pg), o);
      const std::string twice = message_of([&] { ddp.register_comm_hook(allreduce_hook()); });
      EXPECT_NE(twice.find("given as DDPOptions::comm_hook"), std::string::npos) << twice;
    }
    {
      auto net = nets[static_cast<std::size_t>(rank)][2];
      DistributedDataParallel ddp(net, borrow(pg));
      const auto [x, y] = batch(rank, 0);
      ::torch::mse_loss(ddp.forward(x), y).backward();
      const std::string late = message_of([&] { ddp.register_comm_hook(fp16_compress_hook()); });
      EXPECT_NE(late.find("called after the first forward"), std::string::npos) << late;
      // Refused without a collective: training goes on with the plain average.
      ::torch::mse_loss(ddp.forward(x), y).backward();
    }
  });
}

TEST(RegisterCommHook, RanksThatRegisterDifferentHooksGetAMismatchError) {
  const auto nets = testing::per_rank(kRanks, [](int) { return make_mlp(); });
  TorchThreadWorld world(kRanks, "shm");
  const auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    auto net = nets[static_cast<std::size_t>(rank)];
    DistributedDataParallel ddp(net, borrow(pg));
    ddp.register_comm_hook(rank == 0 ? fp16_compress_hook() : bf16_compress_hook());
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const MismatchError& e) {
      EXPECT_NE(std::string(e.what()).find("'comm_hook' is bf16_compress on rank 1 but fp16_compress on rank 0"),
                std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

// Every built-in hook, named through lockstep::torch, registers and trains;
// PowerSGD under PyTorch's spellings too.
TEST(RegisterCommHook, EveryBuiltInHookIsReachableFromLockstepTorch) {
  PowerSGDOptions psgd;
  psgd.start_powerSGD_iter(2).matrix_approximation_rank = 2;
  EXPECT_EQ(psgd.start_powersgd_iter, 2u);
  EXPECT_EQ(psgd.start_powerSGD_iter(), 2u);
  const std::vector<std::pair<std::string, std::function<std::shared_ptr<CommHook>()>>> hooks = {
      {"allreduce", [] { return allreduce_hook(); }},
      {"fp16_compress", [] { return fp16_compress_hook(); }},
      {"bf16_compress", [] { return bf16_compress_hook(); }},
      {"powersgd", [&] { return powersgd_hook(psgd); }},
      {"batched_powersgd", [&] { return batched_powersgd_hook(psgd); }},
      {"powerSGD_hook", [&] { return powerSGD_hook(psgd); }},
      {"batched_powerSGD_hook", [&] { return batched_powerSGD_hook(psgd); }},
  };
  const auto plain = train([] { return DDPOptions{}; }, [](auto&) {});
  for (const auto& [name, make] : hooks) {
    std::vector<std::shared_ptr<CommHook>> registered(kRanks);
    const auto got = train([] { return DDPOptions{}; }, [&](auto& ddp) {
      auto hook = make();
      registered[static_cast<std::size_t>(ddp.reducer().group().rank())] = hook;
      ddp.register_comm_hook(hook);
    });
    ASSERT_EQ(got.size(), plain.size()) << name;
    for (std::size_t i = 0; i < plain.size(); ++i)
      EXPECT_TRUE(::torch::allclose(got[i], plain[i], 0.05, 0.05)) << name << ": parameter " << i;
    EXPECT_EQ(registered[0].use_count(), 1) << name << ": the DDP let go of its hook";
  }
  // PowerSGD at rank 2 compressed after start_powerSGD_iter steps.
  auto hook = powerSGD_hook(psgd);
  train([] { return DDPOptions{}; }, [&](auto& ddp) {
    if (ddp.reducer().group().rank() == 0) ddp.register_comm_hook(hook);
    else ddp.register_comm_hook(powerSGD_hook(psgd));
  });
  EXPECT_GT(hook->compression_stats().ratio(), 1.0);
}

}  // namespace
}  // namespace lockstep::torch
