// Bucket autotuning: the choice against hand-computed step timelines (high
// latency -> bigger buckets; costly bytes and late gradients -> smaller),
// the cost fit recovering a known alpha/beta, and the collective choice on
// thread ranks whose local timings differ on purpose.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "ddp/bucket_autotune.h"
#include "harness/thread_world.h"
#include "harness/vector_gradients.h"
#include "lockstep/reducer.h"

namespace lockstep {
namespace {

using testing::ThreadWorld;

constexpr double kMiB = 1 << 20;

// 8 gradients of 1 MiB, ready at 1, 2, ..., 8 ms of an 8 ms backward.
std::vector<sim::Gradient> evenly_ready() {
  std::vector<sim::Gradient> g;
  for (int i = 1; i <= 8; ++i) g.push_back({kMiB, static_cast<double>(i)});
  return g;
}

// alpha ms per collective plus beta ms per MiB.
std::function<double(double)> line(double alpha_ms, double beta_ms_per_mib) {
  return [=](double bytes) { return alpha_ms + beta_ms_per_mib * bytes / kMiB; };
}

TEST(BucketAutotune, HighLatencyPicksBiggerBuckets) {
  // 5 ms per collective, bytes nearly free, configured 1 MiB buckets: eight
  // collectives one after another from 1 ms: the last ends at 41 ms, 33 ms
  // after backward. One 1 MiB first bucket (1..6 ms) and one of the other 7
  // MiB (ready at 8 ms, 8..13 ms) leave 5 ms + 7 x 0.001.
  const auto c = choose_bucket_cap(evenly_ready(), 8, line(5, 0.001), kMiB, kMiB);
  EXPECT_NEAR(c.configured_exposed_ms, 33 + 8 * 0.001, 1e-9);
  EXPECT_GE(c.cap_bytes, 7 * kMiB);
  EXPECT_EQ(c.buckets, 2u);
  EXPECT_NEAR(c.exposed_ms, 5 + 7 * 0.001, 1e-9);
}

TEST(BucketAutotune, CostlyBytesAndLateGradientsPickSmallerBuckets) {
  // No latency, 1 ms per MiB, configured 25 MiB: the first bucket (1 MiB,
  // 1..2 ms) and one of 7 MiB ready at 8 ms leave 7 ms exposed. With 1 MiB
  // buckets each runs right after its gradient: the last ends at 9 ms.
  // 2 MiB buckets leave 2 ms and 4 MiB 4 ms, so 1 MiB is the best, and
  // smaller caps plan the same buckets (a gradient is not split).
  const auto c = choose_bucket_cap(evenly_ready(), 8, line(0, 1), kMiB, 25 * kMiB);
  EXPECT_NEAR(c.configured_exposed_ms, 7, 1e-9);
  EXPECT_EQ(c.cap_bytes, kMiB);
  EXPECT_EQ(c.buckets, 8u);
  EXPECT_NEAR(c.exposed_ms, 1, 1e-9);
}

TEST(BucketAutotune, BetweenTheExtremesTheBalanceWins) {
  // 1 ms per collective and 0.5 ms per MiB: 1 MiB buckets queue behind
  // each other (each 1.5 ms for a gradient every 1 ms): the last ends at
  // 1 + 8 x 1.5 = 13 ms, 5 exposed; 2 MiB buckets (after the 1 MiB first):
  // 1..2.5, 3..5, 5..7, 7..9, 9..10.5: 2.5 exposed; 4 MiB: 1..2.5, 5..8,
  // 8..10.5: 2.5, as 2 MiB: the larger cap keeps the tie. 8 MiB: 1..2.5,
  // 8..12.5: 4.5.
  const auto c = choose_bucket_cap(evenly_ready(), 8, line(1, 0.5), kMiB, kMiB);
  EXPECT_NEAR(c.configured_exposed_ms, 5, 1e-9);
  EXPECT_EQ(c.cap_bytes, 4 * kMiB);
  EXPECT_NEAR(c.exposed_ms, 2.5, 1e-9);
}

TEST(BucketAutotune, KeepsTheConfiguredCapWhenNothingIsClearlyBetter) {
  // 1 us per collective and per MiB: 25 MiB leaves 8 us exposed (the last
  // 7 MiB), 1 MiB buckets 2 us; 6 us is below the 10 us that counts.
  const auto c = choose_bucket_cap(evenly_ready(), 8, line(0.001, 0.001), kMiB, 25 * kMiB);
  EXPECT_NEAR(c.configured_exposed_ms, 0.008, 1e-12);
  EXPECT_EQ(c.cap_bytes, 25 * kMiB);
}

TEST(BucketAutotune, CandidatesStopAtTheWholeGradient) {
  const auto caps = candidate_caps(3 * kMiB);
  ASSERT_FALSE(caps.empty());
  EXPECT_EQ(caps.back(), 3 * kMiB);
  for (double c : caps) EXPECT_LE(c, 3 * kMiB);
}

TEST(BucketAutotune, FitRecoversAlphaAndBetaOfTheBackendsAlgorithm) {
  for (auto algorithm : {sim::Algorithm::ring, sim::Algorithm::tcp, sim::Algorithm::shm}) {
    for (int world : {2, 4}) {
      sim::Cluster truth;
      truth.ranks_per_host = world;
      truth.intra = truth.inter = sim::Link{12, 4e-4};
      truth.algorithm = algorithm;
      std::vector<AllreduceSample> samples;
      for (double bytes : {16e3, 1e6, 8e6, 64e6}) samples.push_back({bytes, sim::allreduce_us(truth, world, bytes)});
      const sim::Cluster fit = fit_allreduce_cost(samples, algorithm, world);
      EXPECT_NEAR(fit.intra.alpha_us, 12, 1e-6) << sim::to_string(algorithm) << " on " << world;
      EXPECT_NEAR(fit.intra.beta_us_per_byte, 4e-4, 1e-12) << sim::to_string(algorithm) << " on " << world;
    }
  }
}

TEST(BucketAutotune, FitNeverGoesNegative) {
  // Times that fall with size (noise): no negative latency.
  const sim::Cluster fit = fit_allreduce_cost({{1e3, 50}, {1e6, 40}, {8e6, 300}}, sim::Algorithm::ring, 2);
  EXPECT_GE(fit.intra.alpha_us, 0);
  EXPECT_GE(fit.intra.beta_us_per_byte, 0);
  EXPECT_THROW(fit_allreduce_cost({}, sim::Algorithm::ring, 2), InvalidArgument);
}

TEST(BucketAutotune, ContentionIsTheInStepSlowdownOverTheIdlePrediction) {
  sim::Cluster idle;
  idle.ranks_per_host = 2;
  idle.intra = idle.inter = sim::Link{10, 1e-3};
  idle.algorithm = sim::Algorithm::ring;
  // Ring on 2 ranks: 2 x 10 us + S x 1e-3: 1 MB -> 1020 us, 3 MB -> 3020 us;
  // measured 2040 + 6040: twice. Unmeasured buckets (0) do not count.
  EXPECT_DOUBLE_EQ(contention_factor({{1e6, 2040}, {3e6, 6040}, {5e6, 0}}, idle, 2, 1.0), 2.0);
  // Under fp16 compression half the bytes move: 1 MB -> 520 us predicted.
  EXPECT_DOUBLE_EQ(contention_factor({{1e6, 1560}}, idle, 2, 0.5), 3.0);
  // Faster than the idle group (noise) is no contention; nothing measured neither.
  EXPECT_DOUBLE_EQ(contention_factor({{1e6, 500}}, idle, 2, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(contention_factor({}, idle, 2, 1.0), 1.0);
}

// --- on ranks ----------------------------------------------------------------

using testing::VectorGradients;

class AutotuneOnRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(AutotuneOnRanks, EveryRankChoosesTheSameCapThoughTheirTimingsDiffer) {
  constexpr int kRanks = 3;
  // 8 parameters of 256 Ki floats (1 MiB each).
  std::vector<ParamSpec> params;
  for (int i = 0; i < 8; ++i) params.push_back({"p" + std::to_string(i), 256 * 1024, DType::f32});
  std::mutex mutex;
  std::vector<BucketAutotune> chosen(kRanks);
  std::vector<std::vector<std::vector<std::size_t>>> layouts(kRanks);
  ThreadWorld world(kRanks, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    VectorGradients grads(params);
    ReducerOptions o;
    o.buckets = {1u << 20, 25u << 20};
    o.autotune_bucket_cap = true;
    Reducer reducer(std::shared_ptr<ProcessGroup>(&pg, [](ProcessGroup*) {}), params, grads, o);
    for (int step = 0; step < 5; ++step) {
      reducer.maybe_rebuild_buckets();
      EXPECT_EQ(reducer.bucket_autotune().has_value(), step >= 3) << "step " << step;
      for (std::size_t i = 0; i < params.size(); ++i)
        std::fill(grads.grad(i), grads.grad(i) + params[i].count, static_cast<float>(rank + 1));
      reducer.prepare_for_backward();
      for (std::size_t i : reverse_order(params.size())) {
        // Each rank's "backward" computes at its own pace.
        std::this_thread::sleep_for(std::chrono::microseconds(300 * (rank + 1)));
        reducer.mark_ready(i);
      }
      reducer.finalize();
      for (std::size_t i = 0; i < params.size(); ++i)
        ASSERT_EQ(grads.grad(i)[params[i].count - 1], 2.0f) << "step " << step << " param " << i;  // (1+2+3)/3
    }
    std::lock_guard lock(mutex);
    chosen[static_cast<std::size_t>(rank)] = *reducer.bucket_autotune();
    for (const auto& b : reducer.buckets()) layouts[static_cast<std::size_t>(rank)].push_back(b.params);
    EXPECT_EQ(reducer.bucket_cap_bytes(), reducer.bucket_autotune()->bucket_cap_bytes);
  });
  for (int r = 1; r < kRanks; ++r) {
    const auto& a = chosen[0];
    const auto& b = chosen[static_cast<std::size_t>(r)];
    EXPECT_EQ(a.bucket_cap_bytes, b.bucket_cap_bytes) << "rank " << r;
    EXPECT_EQ(a.predicted_exposed_ms, b.predicted_exposed_ms) << "rank " << r;
    EXPECT_EQ(a.backward_ms, b.backward_ms) << "rank " << r;  // the slowest rank's, everywhere
    EXPECT_EQ(layouts[0], layouts[static_cast<std::size_t>(r)]) << "rank " << r;
  }
  // The slowest rank sleeps 8 x 0.9 ms per backward.
  EXPECT_GE(chosen[0].backward_ms, 7.0);
  EXPECT_GT(chosen[0].bucket_cap_bytes, 0u);
  EXPECT_EQ(chosen[0].configured_cap_bytes, 25u << 20);
  EXPECT_EQ(chosen[0].buckets, layouts[0].size());
  EXPECT_GE(chosen[0].contention, 1.0);
  EXPECT_EQ(chosen[0].contention, chosen[1].contention);
}

INSTANTIATE_TEST_SUITE_P(Backends, AutotuneOnRanks, ::testing::Values("shm", "tcp"));

}  // namespace
}  // namespace lockstep
