// DistributedDataParallel's contract beyond equivalence: mismatched models
// are refused, a parameter without gradient is a clear error (never a hang),
// buffers follow rank 0, layout and timings are reported, and it works over
// tcp and across real processes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include <torch/torch.h>

#include "common/clock.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "torch/thread_ranks.h"
#include "lockstep/torch/ddp.h"

namespace lockstep::torch {
namespace {

using lockstep::testing::TorchThreadWorld;
namespace nn = ::torch::nn;

struct NetImpl : nn::Module {
  explicit NetImpl(int hidden = 16, bool with_side = false) {
    fc1 = register_module("fc1", nn::Linear(6, hidden));
    bn = register_module("bn", nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, 3));
    if (with_side) side = register_module("side", nn::Linear(hidden, 3));
  }
  ::torch::Tensor forward(const ::torch::Tensor& x, bool use_side = false) {
    auto h = ::torch::relu(bn(fc1(x)));
    return use_side ? fc2(h) + side(h) : fc2(h);
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, side{nullptr};
  nn::BatchNorm1d bn{nullptr};
};

std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

TEST(DistributedDataParallel, MismatchedModelsAreRefusedOnEveryRankNamingTheDifference) {
  std::vector<std::shared_ptr<NetImpl>> models{std::make_shared<NetImpl>(16), std::make_shared<NetImpl>(17)};
  TorchThreadWorld world(2);
  auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg));
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const MismatchError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'fc1.weight' is [17, 6] Float on rank 1 but [16, 6] Float on rank 0"), std::string::npos)
          << what;
    }
  }
}

// A model that is not on the CPU is refused at construction, naming the
// tensor and its device, before any collective could read device memory as
// host memory. (The meta device stands in for CUDA, which this libtorch may
// not have.)
struct OffCpuNetImpl : nn::Module {
  OffCpuNetImpl() { weight = register_parameter("weight", ::torch::empty({4, 4}, ::torch::Device(::torch::kMeta))); }
  ::torch::Tensor forward(const ::torch::Tensor& x) { return x.matmul(weight); }
  ::torch::Tensor weight;
};

TEST(DistributedDataParallel, AModelOffTheCpuIsRefusedNamingTheTensorAndDevice) {
  auto model = std::make_shared<OffCpuNetImpl>();
  TorchThreadWorld world(1);
  try {
    DistributedDataParallel<OffCpuNetImpl> ddp(model, borrow(world.group(0)));
    FAIL() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parameter 'weight' is on meta"), std::string::npos) << what;
    EXPECT_NE(what.find("takes CPU and CUDA tensors"), std::string::npos) << what;
  }
}

// Bucket sizes that are no number of MB are refused at construction (a NaN
// cap was converted to an integer, which is undefined, and gave any plan).
TEST(DistributedDataParallel, BucketSizesThatAreNoNumberOfMegabytesAreRefused) {
  TorchThreadWorld world(1);
  for (const double mb : {std::nan(""), -1.0, std::numeric_limits<double>::infinity(), 1e300}) {
    for (const bool first : {false, true}) {
      DDPOptions options;
      (first ? options.first_bucket_mb : options.bucket_cap_mb) = mb;
      try {
        DistributedDataParallel<NetImpl> ddp(std::make_shared<NetImpl>(), borrow(world.group(0)), options);
        ADD_FAILURE() << "accepted " << mb;
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(first ? "first_bucket_mb must be a number of MB" : "bucket_cap_mb must be a number of MB"),
                  std::string::npos)
            << what;
      }
    }
  }
}

// Different options make ranks issue different collectives (other bucket
// boundaries, a compressed dtype): refused at construction on every rank,
// before the first backward could pair mismatched all-reduces.
TEST(DistributedDataParallel, MismatchedOptionsAreRefusedOnEveryRankNamingOptionValuesAndRanks) {
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < 3; ++r) models.push_back(std::make_shared<NetImpl>(16));
  TorchThreadWorld world(3);
  auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    DDPOptions options;
    if (rank == 1) options.bucket_cap_mb = 0.01;
    if (rank == 2) options.comm_hook = fp16_compress_hook();
    DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg), options);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const MismatchError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("DistributedDataParallel options differ"), std::string::npos) << what;
      EXPECT_NE(what.find("'bucket_cap_mb' is 0.01 on rank 1 but 25 on rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("'comm_hook' is fp16_compress on rank 2 but none on rank 0"), std::string::npos) << what;
    }
  }
}

TEST(DistributedDataParallel, AParameterWithoutGradientIsAClearErrorAtTheNextForward) {
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < 3; ++r) models.push_back(std::make_shared<NetImpl>(16, /*with_side=*/true));
  TorchThreadWorld world(3, "shm", std::chrono::seconds(30));
  const auto x = ::torch::randn({8, 6});
  const auto start = Clock::now();
  auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg));
    for (int step = 0; step < 3; ++step) {
      // The side branch is used on rank 0 only.
      ddp.forward(x, rank == 0).sum().backward();
    }
  });
  EXPECT_LT(seconds_between(start, Clock::now()), 10.0) << "must fail fast, not at a timeout";
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 1: side.weight, side.bias"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 2: side.weight, side.bias"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters=true"), std::string::npos) << what;
    }
  }
}

TEST(DistributedDataParallel, BuffersFollowRankZeroAndLayoutAndTimingsAreReported) {
  std::vector<std::shared_ptr<NetImpl>> models;
  for (int r = 0; r < 2; ++r) {
    ::torch::manual_seed(r);
    models.push_back(std::make_shared<NetImpl>());
  }
  TorchThreadWorld world(2);
  std::vector<::torch::Tensor> running_means(2);
  world.run([&](int rank, ProcessGroup& pg) {
    DDPOptions options;
    options.bucket_cap_mb = options.first_bucket_mb = 1e-9;  // one parameter per bucket
    DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg), options);
    const auto layout = ddp.bucket_layout();
    ASSERT_EQ(layout.size(), 6u);  // fc1 w/b, bn w/b, fc2 w/b
    EXPECT_EQ(layout.front(), std::vector<std::string>{"fc2.bias"});
    auto x = ::torch::full({8, 6}, static_cast<float>(rank + 1));  // different data, different batch statistics
    ddp.forward(x).sum().backward();
    ddp.forward(x).sum().backward();  // its forward first takes rank 0's running stats
    const StepTimes& t = ddp.last_step();
    EXPECT_GE(t.forward_end_us, t.forward_start_us);
    EXPECT_TRUE(t.backward.synchronised);
    EXPECT_EQ(t.backward.buckets.size(), 6u);
    EXPECT_GE(t.backward.finalize_end_us, t.backward.backward_end_us);
    EXPECT_GT(t.backward.bytes(), 0u);
    // Each rank's training forward updated its statistics from its own batch.
    running_means[static_cast<std::size_t>(rank)] = ddp.module().bn->running_mean.clone();
  });
  EXPECT_FALSE(::torch::equal(running_means[0], running_means[1]));
}

TEST(DistributedDataParallel, EveryTrainingForwardStartsFromRankZerosBuffers) {
  for (bool broadcast : {true, false}) {
    std::vector<std::shared_ptr<NetImpl>> models{std::make_shared<NetImpl>(), std::make_shared<NetImpl>()};
    TorchThreadWorld world(2);
    std::vector<::torch::Tensor> means(2);
    world.run([&](int rank, ProcessGroup& pg) {
      DDPOptions options;
      options.broadcast_buffers = broadcast;
      DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg), options);
      // Different batches: the ranks' running statistics drift apart...
      ddp.forward(::torch::full({8, 6}, static_cast<float>(rank + 1))).sum().backward();
      // ...and one batch for both: equal afterwards only if both started
      // this forward from rank 0's statistics.
      ddp.forward(::torch::ones({8, 6})).sum().backward();
      means[static_cast<std::size_t>(rank)] = ddp.module().bn->running_mean.clone();
    });
    EXPECT_EQ(::torch::equal(means[0], means[1]), broadcast) << "broadcast_buffers=" << broadcast;
  }
}

TEST(DistributedDataParallel, EvaluationOnOneRankIssuesNoCollective) {
  std::vector<std::shared_ptr<NetImpl>> models{std::make_shared<NetImpl>(), std::make_shared<NetImpl>()};
  const auto x = ::torch::randn({8, 6});
  TorchThreadWorld world(2, "tcp", std::chrono::seconds(10));
  world.run([&](int rank, ProcessGroup& pg) {
    DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg));
    ddp.forward(x).sum().backward();
    // Barriers number the group's operations around the evaluation: one
    // more operation in between than the barrier itself is a stray
    // collective issued by the evaluation.
    auto before = pg.barrier();
    before->wait();
    if (rank == 0) {
      ::torch::NoGradGuard no_grad;
      ddp.module().eval();
      for (int i = 0; i < 3; ++i) ddp.forward(x);
      ddp.module().train();
    }
    auto after = pg.barrier();
    after->wait();
    EXPECT_EQ(after->seq(), before->seq() + 1) << "rank " << rank << ": the evaluation issued collectives";
    // Both ranks still agree on the sequence of collectives.
    ddp.forward(x).sum().backward();
  });
}

TEST(DistributedDataParallel, NoSyncGuardRestoresSynchronisation) {
  auto model = std::make_shared<NetImpl>();
  TorchThreadWorld world(1);
  world.run([&](int, ProcessGroup& pg) {
    DistributedDataParallel<NetImpl> ddp(model, borrow(pg));
    EXPECT_TRUE(ddp.reducer().sync());
    {
      auto guard = ddp.no_sync();
      EXPECT_FALSE(ddp.reducer().sync());
    }
    EXPECT_TRUE(ddp.reducer().sync());
  });
}

// The global batch the training tests use (made before any thread rank
// starts: libtorch's default generator is shared by the process).
std::pair<::torch::Tensor, ::torch::Tensor> batch() {
  ::torch::manual_seed(99);
  auto x = ::torch::randn({12, 6});
  return {x, ::torch::randn({12, 3})};
}

// Trains a few steps in this process's group and returns the parameters;
// the global batch is split by rank.
std::vector<::torch::Tensor> train(ProcessGroup& pg, std::shared_ptr<NetImpl> model, int steps,
                                   const std::pair<::torch::Tensor, ::torch::Tensor>& data) {
  DistributedDataParallel<NetImpl> ddp(std::move(model), borrow(pg));
  ::torch::optim::SGD opt(ddp.module().parameters(), 0.1);
  const auto& [x, y] = data;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    ::torch::mse_loss(ddp.forward(x.chunk(pg.size())[pg.rank()]), y.chunk(pg.size())[pg.rank()]).backward();
    opt.step();
  }
  std::vector<::torch::Tensor> out;
  for (auto& p : ddp.module().parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(DistributedDataParallel, StepStatisticsSplitDataLoadingAndSkipEvaluation) {
  std::vector<std::shared_ptr<NetImpl>> models{std::make_shared<NetImpl>(), std::make_shared<NetImpl>()};
  TorchThreadWorld world(2, "shm");
  std::vector<RankSummary> summaries(2);
  std::vector<std::vector<RankSummary>> windows(2);
  double rank0_ms_outside_pause = 0;  // rank 0's loop, less its evaluation pause
  const auto x = ::torch::randn({8, 6}), y = ::torch::randn({8, 3});
  world.run([&](int rank, ProcessGroup& pg) {
    DDPOptions options;
    options.stats_window = 4;
    DistributedDataParallel<NetImpl> ddp(models[static_cast<std::size_t>(rank)], borrow(pg), options);
    const auto loop_start = Clock::now();
    double pause_ms = 0;
    auto loading = ddp.data_timer();
    for (int step = 0; step < 10; ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // "loading" a batch
      loading.stop();
      ::torch::mse_loss(ddp.forward(x), y).backward();
      if (step == 5 && rank == 0) {  // evaluation on one rank, with a long pause: not a step
        ddp.module().eval();
        ::torch::NoGradGuard no_grad;
        ddp.forward(x);
        const auto pause_start = Clock::now();
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        pause_ms = 1000.0 * seconds_between(pause_start, Clock::now());
        ddp.module().train();
      }
      loading.restart();
    }
    if (rank == 0) rank0_ms_outside_pause = 1000.0 * seconds_between(loop_start, Clock::now()) - pause_ms;
    summaries[static_cast<std::size_t>(rank)] = ddp.summary();
    windows[static_cast<std::size_t>(rank)] = ddp.last_window();
  });
  for (int r = 0; r < 2; ++r) {
    const auto& s = summaries[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.steps, 7u) << "9 closed steps, the first two left out";  // the 10th is still open
    // Rank 0's loading right after its evaluation pause belongs to no step.
    EXPECT_GE(s.data_ms, r == 0 ? 4.0 : 4.9) << "rank " << r;
    // Rank 0's steps lie inside its loop; unless the pause was counted in
    // one of them, they fit in the loop's time outside the pause (however
    // slow a loaded machine made that). 5 ms for the clocks' resolution.
    // (Rank 1's next step really waits for rank 0: that wait is its exposed
    // communication.)
    if (r == 0)
      EXPECT_LE(s.step_ms * static_cast<double>(s.steps), rank0_ms_outside_pause + 5.0)
          << "the evaluation pause counted as a step";
    EXPECT_GE(s.step_ms, s.data_ms);
    EXPECT_GT(s.bytes, 0);
    // Both ranks compared the same two windows of four steps.
    ASSERT_EQ(windows[static_cast<std::size_t>(r)].size(), 2u);
    EXPECT_EQ(windows[static_cast<std::size_t>(r)][1].steps, 4u);
  }
}

TEST(DistributedDataParallel, TcpBackendGivesTheSameParametersAsShm) {
  std::vector<std::vector<::torch::Tensor>> results;
  for (const char* backend : {"shm", "tcp"}) {
    std::vector<std::shared_ptr<NetImpl>> models;
    for (int r = 0; r < 2; ++r) {
      ::torch::manual_seed(5);
      models.push_back(std::make_shared<NetImpl>());
    }
    const auto data = batch();
    TorchThreadWorld world(2, backend);
    std::vector<std::vector<::torch::Tensor>> per_rank(2);
    world.run([&](int rank, ProcessGroup& pg) {
      per_rank[static_cast<std::size_t>(rank)] = train(pg, models[static_cast<std::size_t>(rank)], 3, data);
    });
    results.push_back(per_rank[0]);
  }
  for (std::size_t i = 0; i < results[0].size(); ++i) EXPECT_TRUE(::torch::allclose(results[0][i], results[1][i], 1e-6, 1e-7));
}

TEST(DistributedDataParallel, GradientsOutliveTheWrapperAndTheGroup) {
  // After a step the gradients live in the reducer's shared-memory buckets,
  // with or without bucket views: they must stay valid once the wrapper and
  // the group are gone. Without views the gradient tensors are the same
  // objects from one step to the next.
  for (bool view : {false, true}) {
    std::vector<std::shared_ptr<NetImpl>> models;
    for (int r = 0; r < 2; ++r) {
      ::torch::manual_seed(5);
      models.push_back(std::make_shared<NetImpl>());
    }
    const auto data = batch();
    std::vector<std::vector<::torch::Tensor>> seen(2);
    {
      TorchThreadWorld world(2, "shm");
      world.run([&](int rank, ProcessGroup& pg) {
        DDPOptions options;
        options.gradient_as_bucket_view = view;
        auto model = models[static_cast<std::size_t>(rank)];
        DistributedDataParallel<NetImpl> ddp(model, borrow(pg), options);
        const auto& [x, y] = data;
        std::vector<::torch::Tensor> tensors;
        for (int s = 0; s < 3; ++s) {
          for (auto& p : model->parameters())
            if (p.grad().defined()) p.mutable_grad().zero_();
          ::torch::mse_loss(ddp.forward(x.chunk(2)[rank]), y.chunk(2)[rank]).backward();
          if (s == 1)
            for (auto& p : model->parameters()) tensors.push_back(p.grad());
        }
        std::size_t k = 0;
        for (auto& p : model->parameters()) {
          if (!view) EXPECT_TRUE(p.grad().is_same(tensors[k++]));
          seen[static_cast<std::size_t>(rank)].push_back(p.grad().clone());
        }
      });
    }
    for (std::size_t r = 0; r < 2; ++r) {
      std::size_t i = 0;
      for (auto& p : models[r]->parameters()) EXPECT_TRUE(::torch::equal(p.grad(), seen[r][i++])) << view;
      for (auto& p : models[r]->parameters()) p.mutable_grad().add_(1.0f);  // still writable
    }
    EXPECT_TRUE(::torch::equal(seen[0][0], seen[1][0]));  // and the average of both ranks
  }
}

TEST(DistributedDataParallel, TrainsAcrossRealProcessesLikeOneProcess) {
  // Each rank trains in its own process over shm, then checks its result
  // against a one-process run on the whole batch done by itself.
  const lockstep::testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  lockstep::testing::ProcessRanks ranks(
      2,
      [&](int r) {
        return lockstep::testing::EnvMap{{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(port)}, {"LOCKSTEP_TIMEOUT", "60"}};
      },
      [](int) {
        at::set_num_threads(1);
        auto pg = init_process_group();
        ::torch::manual_seed(5);
        auto model_for_ddp = std::make_shared<NetImpl>();
        auto got = train(*pg, model_for_ddp, 3, batch());
        // The reference: one process, a world of one, the whole batch as two
        // accumulated halves (BatchNorm normalises per rank's half).
        GroupOptions solo;
        solo.rank = 0;
        solo.world_size = 1;
        solo.store = std::make_shared<HashStore>();
        auto one = init_process_group(solo);
        ::torch::manual_seed(5);
        auto model = std::make_shared<NetImpl>();
        ::torch::optim::SGD opt(model->parameters(), 0.1);
        const auto [x, y] = batch();
        for (int s = 0; s < 3; ++s) {
          opt.zero_grad();
          for (int k = 0; k < 2; ++k) (::torch::mse_loss(model->forward(x.chunk(2)[k]), y.chunk(2)[k]) / 2).backward();
          opt.step();
        }
        auto want = model->parameters();
        for (std::size_t i = 0; i < want.size(); ++i)
          if (!::torch::allclose(got[i], want[i], 1e-5, 1e-6)) throw std::runtime_error("parameters differ from one process");
        if (pg->backend() != "shm") throw std::runtime_error("expected the shm backend on one host");
      });
  for (const auto& r : ranks.wait_all(std::chrono::seconds(120)))
    EXPECT_EQ(r.exit_code, lockstep::testing::kExitOk) << lockstep::testing::describe(r);
}

}  // namespace
}  // namespace lockstep::torch
