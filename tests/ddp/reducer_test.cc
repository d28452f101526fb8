// The Reducer over plain vectors, ranks as threads: averages, launch order,
// missing gradients, no_sync, rebuilt buckets, bucket views, compression
// hooks and static graphs — everything except libtorch.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <thread>

#include "comm/device_memory.h"
#include "common/clock.h"
#include "common/half.h"
#include "harness/thread_world.h"
#include "harness/vector_gradients.h"
#include "lockstep/powersgd.h"
#include "lockstep/reducer.h"

namespace lockstep {
namespace {

using testing::ThreadWorld;
using testing::VectorGradients;

std::vector<ParamSpec> model() {
  return {{"layer0.weight", 3000, DType::f32}, {"layer0.bias", 30, DType::f32}, {"layer1.weight", 50000, DType::f32},
          {"layer1.bias", 7, DType::f32},      {"layer2.weight", 900, DType::f32}};
}

ReducerOptions small_buckets() {
  ReducerOptions o;
  o.buckets = {16 * 1024, 64 * 1024};
  return o;
}

ReducerOptions small_buckets_allowing_unused() {
  ReducerOptions o = small_buckets();
  o.find_unused_parameters = true;
  return o;
}

// The thread world owns the group; the reducer only uses it.
std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

// Rank r's gradient for parameter i, element k: the average over n ranks is
// exact in float, so results can be compared exactly.
float grad_value(int r, std::size_t i, std::size_t k) { return static_cast<float>((r + 1) * 4 + static_cast<int>((i + k) % 5)); }
float average(int n, std::size_t i, std::size_t k) {
  float sum = 0;
  for (int r = 0; r < n; ++r) sum += grad_value(r, i, k);
  return sum / static_cast<float>(n);
}

void fill(VectorGradients& g, const std::vector<ParamSpec>& params, int rank) {
  for (std::size_t i = 0; i < params.size(); ++i)
    for (std::size_t k = 0; k < params[i].count; ++k) g.grad(i)[k] = grad_value(rank, i, k);
}

// One backward pass: prepare, mark parameters ready in `order`, finalize.
void backward(Reducer& reducer, const std::vector<std::size_t>& order, const std::vector<std::size_t>& unused = {}) {
  reducer.prepare_for_backward(unused);
  for (std::size_t i : order) reducer.mark_ready(i);
  reducer.finalize();
}

class ReducerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReducerTest, AveragesEveryGradientWhateverOrderRanksFinishIn) {
  for (int n : {1, 2, 3, 4}) {
    ThreadWorld world(n, GetParam());
    world.run([&](int rank, ProcessGroup& pg) {
      const auto params = model();
      VectorGradients grads(params);
      Reducer reducer(borrow(pg), params, grads, small_buckets());
      ASSERT_GT(reducer.buckets().size(), 1u);
      for (int step = 0; step < 3; ++step) {
        fill(grads, params, rank);
        std::vector<std::size_t> order = reverse_order(params.size());
        std::mt19937 rng(static_cast<unsigned>(rank * 31 + step));
        std::shuffle(order.begin(), order.end(), rng);  // each rank its own order
        backward(reducer, order);
        for (std::size_t i = 0; i < params.size(); ++i)
          for (std::size_t k = 0; k < params[i].count; k += 97)
            ASSERT_EQ(grads.grad(i)[k], average(n, i, k)) << "param " << i << " element " << k << " step " << step;
        const StepStats& stats = reducer.last_step();
        EXPECT_TRUE(stats.synchronised);
        EXPECT_EQ(stats.buckets.size(), reducer.buckets().size());
        EXPECT_EQ(stats.bytes(), (3000 + 30 + 50000 + 7 + 900) * sizeof(float));
        for (const auto& b : stats.buckets) EXPECT_GE(b.finished_us, b.launched_us);
      }
    });
  }
}

TEST_P(ReducerTest, MissingGradientIsReportedAtTheNextForwardOnEveryRankNamingIt) {
  ThreadWorld world(3, GetParam(), std::chrono::seconds(20));
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets());
    fill(grads, params, rank);
    std::vector<std::size_t> order = reverse_order(params.size());
    if (rank == 1) order.erase(std::find(order.begin(), order.end(), 3u));  // layer1.bias gets no gradient on rank 1
    const auto start = Clock::now();
    backward(reducer, order);  // must not hang
    EXPECT_LT(seconds_between(start, Clock::now()), 5.0);
    try {
      reducer.check_previous_iteration();
      FAIL() << "rank " << rank << ": no error";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 1: layer1.bias"), std::string::npos) << what;
      EXPECT_NE(what.find("find_unused_parameters"), std::string::npos) << what;
    }
    EXPECT_NO_THROW(reducer.check_previous_iteration());  // reported once
  });
}

TEST_P(ReducerTest, UnusedParametersContributeZerosWhenAllowed) {
  ThreadWorld world(2, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets_allowing_unused());
    fill(grads, params, rank);
    std::vector<std::size_t> order = reverse_order(params.size());
    std::vector<std::size_t> unused;
    if (rank == 0) {  // declared unused on rank 0
      order.erase(std::find(order.begin(), order.end(), 2u));
      unused = {2};
    }
    if (rank == 1) order.erase(std::find(order.begin(), order.end(), 4u));  // found missing at the end on rank 1
    backward(reducer, order, unused);
    EXPECT_NO_THROW(reducer.check_previous_iteration());
    EXPECT_EQ(grads.grad(2)[0], grad_value(1, 2, 0) / 2);  // (0 + rank 1's) / 2
    EXPECT_EQ(grads.grad(4)[5], grad_value(0, 4, 5) / 2);
    EXPECT_EQ(grads.grad(0)[0], average(2, 0, 0));
  });
}

TEST_P(ReducerTest, NoSyncAccumulatesUntilTheNextSynchronisedBackward) {
  ThreadWorld world(2, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets());
    fill(grads, params, rank);  // as if three micro-batches accumulated locally
    reducer.set_sync(false);
    backward(reducer, reverse_order(params.size()));
    backward(reducer, reverse_order(params.size()));
    EXPECT_FALSE(reducer.last_step().synchronised);
    EXPECT_EQ(grads.grad(0)[0], grad_value(rank, 0, 0));  // untouched
    reducer.set_sync(true);
    backward(reducer, reverse_order(params.size()));
    EXPECT_EQ(grads.grad(0)[0], average(2, 0, 0));
  });
}

TEST_P(ReducerTest, BucketsAreRebuiltInRankZerosObservedOrderOnEveryRank) {
  ThreadWorld world(2, GetParam());
  std::vector<std::vector<std::vector<std::size_t>>> layouts(2);
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets());
    EXPECT_FALSE(reducer.maybe_rebuild_buckets());  // nothing observed yet
    fill(grads, params, rank);
    // Rank 0 sees the model order, rank 1 another one; rank 0's wins.
    backward(reducer, rank == 0 ? std::vector<std::size_t>{0, 1, 2, 3, 4} : std::vector<std::size_t>{4, 2, 0, 1, 3});
    EXPECT_TRUE(reducer.maybe_rebuild_buckets());
    EXPECT_TRUE(reducer.buckets_rebuilt());
    EXPECT_EQ(reducer.buckets().front().params.front(), 0u);
    for (const auto& b : reducer.buckets()) layouts[static_cast<std::size_t>(rank)].push_back(b.params);
    fill(grads, params, rank);
    backward(reducer, reverse_order(params.size()));
    EXPECT_EQ(grads.grad(2)[10], average(2, 2, 10));
    EXPECT_FALSE(reducer.maybe_rebuild_buckets());  // once only
  });
  EXPECT_EQ(layouts[0], layouts[1]);
}

TEST_P(ReducerTest, GradientsAsBucketViewsNeedNoCopies) {
  ThreadWorld world(2, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    ReducerOptions options = small_buckets();
    options.gradient_as_bucket_view = true;
    Reducer reducer(borrow(pg), params, grads, options);
    for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(grads.gradient(i), reducer.bucket_slot(i));
    fill(grads, params, rank);
    backward(reducer, reverse_order(params.size()));
    EXPECT_EQ(grads.grad(1)[3], average(2, 1, 3));
  });
}

TEST_P(ReducerTest, WithoutViewsNoCollectiveWritesGradientsAndNoneAreCopiedAfterTheFirstStep) {
  ThreadWorld world(2, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets());
    for (int step = 0; step < 4; ++step) {
      fill(grads, params, rank);
      reducer.prepare_for_backward();
      for (std::size_t i : reverse_order(params.size())) reducer.mark_ready(i);
      // Every bucket is launched; a barrier behind them completes only after
      // they have (a group runs its operations in issue order). They must
      // not have touched the gradients.
      pg.barrier()->wait();
      for (std::size_t i = 0; i < params.size(); ++i) ASSERT_EQ(grads.grad(i)[1], grad_value(rank, i, 1)) << i;
      reducer.finalize();
      for (std::size_t i = 0; i < params.size(); ++i) {
        ASSERT_EQ(grads.grad(i)[1], average(2, i, 1)) << i;
        // The average is where the next backward reads from: no copy in.
        ASSERT_EQ(grads.gradient(i), reducer.bucket_slot(i)) << i;
      }
    }
  });
}

TEST_P(ReducerTest, AGradientUnusedOnEveryRankKeepsItsValues) {
  ThreadWorld world(2, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets_allowing_unused());
    fill(grads, params, rank);
    backward(reducer, reverse_order(params.size()));  // parameter 1 now lives in a bucket
    std::vector<std::size_t> order = reverse_order(params.size());
    order.erase(std::find(order.begin(), order.end(), 1u));
    fill(grads, params, rank);
    std::fill(grads.grad(1), grads.grad(1) + params[1].count, 7.0f);
    backward(reducer, order, {1});
    EXPECT_EQ(grads.grad(1)[0], 7.0f);
    EXPECT_EQ(grads.grad(1)[params[1].count - 1], 7.0f);
    EXPECT_EQ(grads.grad(0)[2], average(2, 0, 2));
  });
}

TEST_P(ReducerTest, CompressionHooksAverageWithinHalfPrecision) {
  for (bool bf16 : {false, true}) {
    ThreadWorld world(3, GetParam());
    world.run([&](int rank, ProcessGroup& pg) {
      const auto params = model();
      VectorGradients grads(params);
      ReducerOptions options = small_buckets();
      options.comm_hook = bf16 ? bf16_compress_hook() : fp16_compress_hook();
      Reducer reducer(borrow(pg), params, grads, options);
      fill(grads, params, rank);
      backward(reducer, reverse_order(params.size()));
      const float tolerance = bf16 ? 1.0f / 64 : 1.0f / 512;  // relative, a little over half an ulp
      for (std::size_t i = 0; i < params.size(); ++i)
        for (std::size_t k = 0; k < params[i].count; k += 13)
          ASSERT_NEAR(grads.grad(i)[k], average(3, i, k), tolerance * average(3, i, k)) << i << " " << k;
    });
  }
}

TEST_P(ReducerTest, StaticGraphAcceptsGradientsThatArriveSeveralTimes) {
  ThreadWorld world(2, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    ReducerOptions options = small_buckets();
    options.static_graph = true;
    Reducer reducer(borrow(pg), params, grads, options);
    // Parameter 2 is used twice per backward (its hook fires twice), as with
    // re-entrant checkpointing; parameter 3 is never used.
    const std::vector<std::size_t> order{4, 2, 1, 2, 0};
    for (int step = 0; step < 3; ++step) {
      fill(grads, params, rank);
      backward(reducer, order);
      EXPECT_NO_THROW(reducer.check_previous_iteration());
      EXPECT_EQ(grads.grad(2)[0], average(2, 2, 0)) << "step " << step;
      EXPECT_EQ(grads.grad(3)[0], 0.0f) << "step " << step;
    }
  });
}

TEST_P(ReducerTest, AGradientArrivingTwiceWithoutStaticGraphIsAnError) {
  ThreadWorld world(1, GetParam());
  world.run([&](int, ProcessGroup& pg) {
    const auto params = model();
    VectorGradients grads(params);
    Reducer reducer(borrow(pg), params, grads, small_buckets());
    reducer.prepare_for_backward();
    reducer.mark_ready(2);
    try {
      reducer.mark_ready(2);
      FAIL() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("static_graph"), std::string::npos) << e.what();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, ReducerTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// Gradients that say they are on cuda:0; never touched (every test here
// is refused before a gradient is read).
class CudaLabelledGradients final : public GradientSource {
 public:
  void* gradient(std::size_t) override { throw std::logic_error("a refused reducer read a gradient"); }
  bool has_gradient(std::size_t) const override { return false; }
  void use_as_gradient(std::size_t, void*, std::shared_ptr<void>) override {}
  void move_out_of(std::size_t, const void*) override {}
  Device device() const override { return Device::cuda(0); }
};

// A hook whose work runs on the host only (as a user's may).
class HostOnlyHook final : public CommHook {
 public:
  std::string name() const override { return "host_only"; }
  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override {
    return pg.allreduce(bucket.buffer, ReduceOp::avg);
  }
  bool supports(Device device) const override { return !device.is_cuda(); }
};

// A hook whose work runs on the host cannot take buckets in device memory:
// refused when the Reducer is built, naming the hook and the device, not
// in the middle of a backward pass.
TEST(ReducerOnCuda, AHostOnlyHookIsRefusedAtConstruction) {
  ThreadWorld world(1);
  CudaLabelledGradients grads;
  ReducerOptions options;
  options.comm_hook = std::make_shared<HostOnlyHook>();
  try {
    Reducer reducer(std::shared_ptr<ProcessGroup>(&world.group(0), [](ProcessGroup*) {}),
                    {ParamSpec{"w", 16, DType::f32, {4, 4}}}, grads, options);
    FAIL() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot reduce gradients on cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("host_only"), std::string::npos) << what;
  }
}

// Where no GPU can be used, gradients on one are a ConfigError that says
// why: this lockstep has no CUDA, or this process sees no device.
TEST(ReducerOnCuda, GradientsOnAGpuWithoutOneSayWhy) {
  if (built_with_cuda() && access("/dev/nvidiactl", F_OK) == 0) GTEST_SKIP() << "this machine has a CUDA device";
  ThreadWorld world(1);
  CudaLabelledGradients grads;
  try {
    Reducer reducer(std::shared_ptr<ProcessGroup>(&world.group(0), [](ProcessGroup*) {}),
                    {ParamSpec{"w", 16, DType::f32, {}}}, grads);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(built_with_cuda() ? "sees no CUDA device" : "built without CUDA"), std::string::npos) << what;
    EXPECT_NE(what.find("gradients are on"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace lockstep
