// `lockstep simulate`'s model: each algorithm's cost against hand-computed
// cases, the step simulation against small timelines with known answers,
// bucket planning against DDP's own planner, profiles read from trace and
// stats files, and calibration recovering known alpha/beta/gamma from
// synthetic `lockstep bench` tables.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "common/bench_table.h"
#include "lockstep/error.h"
#include "lockstep/reducer.h"
#include "simulate/calibration.h"
#include "simulate/cluster_presets.h"
#include "simulate/cost_model.h"
#include "simulate/step_simulation.h"
#include "simulate/workload.h"

namespace lockstep::sim {
namespace {

Cluster flat(Algorithm a, double alpha, double beta, double gamma = 0, int per_host = 64) {
  Cluster c;
  c.ranks_per_host = per_host;
  c.intra = c.inter = Link{alpha, beta};
  c.gamma_us_per_byte = gamma;
  c.algorithm = a;
  return c;
}

// --- cost model -------------------------------------------------------------

TEST(CostModel, RingIsTwoNMinusOneStepsAndTwiceTheShareOfBytes) {
  // 4 ranks, 1 MB, 10 us per message, 1 GB/s: 6 x 10 + 1.5 x 1e6 x 1e-3.
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::ring, 10, 1e-3), 4, 1e6), 60 + 1500);
  // The reduction: each rank reduces (n-1)/n of the buffer.
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::ring, 0, 0, 2e-3), 4, 1e6), 0.75 * 1e6 * 2e-3);
}

TEST(CostModel, RecursiveDoublingExchangesTheWholeBufferLogNTimes) {
  // 8 ranks: 3 rounds of (alpha + S beta + S gamma).
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::recursive_doubling, 10, 1e-3, 2e-3), 8, 1000), 30 + 3 + 6);
  // 6 ranks: 2 rounds among 4, plus folding the 2 extra ranks in and out.
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::recursive_doubling, 10, 1e-3), 6, 1000), 40 + 4);
}

TEST(CostModel, HalvingDoublingHasRingVolumeInLogSteps) {
  // 8 ranks: 6 steps, 2 x 7/8 of the buffer sent, 7/8 reduced.
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::halving_doubling, 10, 1e-3, 1e-3), 8, 8000), 60 + 14 + 7);
}

TEST(CostModel, ShmOneShotAndTwoShot) {
  // One-shot on 4 ranks: copy in, two synchronisations, reduce 3 other inputs.
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::one_shot, 1, 1e-3, 2e-3), 4, 1000), 2 + 1 + 6);
  // Two-shot on 2 ranks, 1 MiB: rounds of 2 x 128 KiB -> 4 rounds, 8 syncs.
  const double s = 1 << 20;
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::two_shot, 1, 1e-3), 2, s), 8 + s * 1e-3);
  // The backend's choice: one-shot up to 128 KiB on 2 ranks.
  EXPECT_DOUBLE_EQ(allreduce_us(flat(Algorithm::shm, 1, 1e-3), 2, 1000), allreduce_us(flat(Algorithm::one_shot, 1, 1e-3), 2, 1000));
}

TEST(CostModel, TcpSwitchesFromRecursiveDoublingToRingAbove64KiB) {
  const Cluster c = flat(Algorithm::tcp, 10, 1e-3);
  const double small = 64 * 1024, large = small + 1;
  EXPECT_DOUBLE_EQ(allreduce_us(c, 8, small), allreduce_us(flat(Algorithm::recursive_doubling, 10, 1e-3), 8, small));
  EXPECT_DOUBLE_EQ(allreduce_us(c, 8, large), allreduce_us(flat(Algorithm::ring, 10, 1e-3), 8, large));
}

TEST(CostModel, HierarchicalAddsItsThreePhases) {
  Cluster c;
  c.ranks_per_host = 4;
  c.intra = Link{1, 1e-4};
  c.inter = Link{10, 1e-2};
  c.algorithm = Algorithm::hierarchical;
  // 2 hosts x 4, 8 MB: reduce-scatter inside (3 steps, 3/4 of S), a ring
  // of 2 hosts on S/4 (2 steps, all of it), allgather inside.
  const double inside = 3 * 1 + 0.75 * 8e6 * 1e-4;
  const double between = 2 * 10 + 1.0 * 2e6 * 1e-2;
  EXPECT_DOUBLE_EQ(allreduce_us(c, 8, 8e6), inside + between + inside);
}

TEST(CostModel, FlatAlgorithmsAcrossHostsArePacedByTheSlowerLink) {
  Cluster c = flat(Algorithm::ring, 1, 1e-4, 0, 4);
  c.inter = Link{10, 1e-2};
  EXPECT_DOUBLE_EQ(allreduce_us(c, 4, 1e6), 6 * 1 + 1.5 * 1e6 * 1e-4);
  EXPECT_DOUBLE_EQ(allreduce_us(c, 8, 1e6), 14 * 10 + 1.75 * 1e6 * 1e-2);
}

TEST(CostModel, OneRankCommunicatesNothing) {
  EXPECT_EQ(allreduce_us(flat(Algorithm::ring, 10, 1), 1, 1e9), 0);
}

TEST(CostModel, UnknownAlgorithmNamesTheKnownOnes) {
  try {
    parse_algorithm("tree");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("hierarchical"), std::string::npos);
  }
  EXPECT_EQ(parse_algorithm("halving_doubling"), Algorithm::halving_doubling);
}

// --- step simulation --------------------------------------------------------

Workload timeline(double forward, double backward, double other) {
  Workload w;
  w.forward_ms = forward;
  w.backward_ms = backward;
  w.other_ms = other;
  return w;
}

TEST(StepSimulation, ABucketWaitsForItsPredecessorAndTheOverhangIsExposed) {
  // Backward 10 ms. Bucket 0 ready at 4 takes 3 (4-7); bucket 1 ready at 6
  // takes 5 but starts at 7 (7-12): 2 ms after backward ends.
  const std::vector<PlannedBucket> b{{100, 4}, {200, 6}};
  const auto p = simulate_step(timeline(5, 10, 1), b, [](double bytes) { return bytes == 100 ? 3.0 : 5.0; });
  ASSERT_EQ(p.buckets.size(), 2u);
  EXPECT_DOUBLE_EQ(p.buckets[1].start_ms, 7);
  EXPECT_DOUBLE_EQ(p.buckets[1].end_ms, 12);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 2);
  EXPECT_DOUBLE_EQ(p.comm_ms, 8);
  EXPECT_DOUBLE_EQ(p.step_ms, 5 + 10 + 1 + 2);
}

TEST(StepSimulation, CommunicationThatEndsBeforeBackwardIsHidden) {
  const std::vector<PlannedBucket> b{{1, 1}, {1, 3}, {1, 5}};
  const auto p = simulate_step(timeline(2, 10, 0), b, [](double) { return 1.0; });
  EXPECT_DOUBLE_EQ(p.exposed_ms, 0);
  EXPECT_DOUBLE_EQ(p.step_ms, 12);
}

TEST(StepSimulation, OneBucketAtTheEndExposesAllOfIt) {
  const auto p = simulate_step(timeline(2, 10, 0), {{1, 10}}, [](double) { return 4.0; }, /*straggler_ms=*/1.5);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 4);
  EXPECT_DOUBLE_EQ(p.step_ms, 2 + 10 + 4 + 1.5);
}

TEST(StepSimulation, IdleGroupStartsABucketWhenItIsReady) {
  const auto p = simulate_step(timeline(0, 10, 0), {{1, 2}, {1, 8}}, [](double) { return 1.0; });
  EXPECT_DOUBLE_EQ(p.buckets[1].start_ms, 8);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 0);
}

TEST(StepSimulation, BucketWorkDelaysReadinessAndCopiesBackFollowTheLastAllReduce) {
  // 2000 bytes at 1 us per byte: 2 ms on the bucket during backward (ready
  // at 10 + 2); with a copy back, 2 ms more after the all-reduce (12-15).
  CpuCosts cpu;
  cpu.copy_us_per_byte = 1;
  const auto p = simulate_step(timeline(5, 10, 1), {{2000, 10}}, [](double) { return 3.0; }, 0, cpu);
  EXPECT_DOUBLE_EQ(p.buckets[0].start_ms, 12);
  EXPECT_DOUBLE_EQ(p.copy_ms, 2);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 3);
  EXPECT_DOUBLE_EQ(p.sharing_ms, 0);
  EXPECT_DOUBLE_EQ(p.step_ms, 5 + 10 + 1 + 2 + 3);
  cpu.copy_back_us_per_byte = 1;
  const auto back = simulate_step(timeline(5, 10, 1), {{2000, 10}}, [](double) { return 3.0; }, 0, cpu);
  EXPECT_DOUBLE_EQ(back.copy_ms, 4);
  EXPECT_DOUBLE_EQ(back.step_ms, 5 + 10 + 1 + 4 + 3);
}

TEST(StepSimulation, ABusyCollectiveOnTheComputeCoreHalvesBothWhileTheyOverlap) {
  // Ready at 2, 4 ms alone, keeping its core busy: from 2 both run at half
  // speed, so it ends at 10 with 6 of backward's 10 ms done; the last 4
  // run alone, so backward ends at 14.
  CpuCosts cpu;
  cpu.comm_cpu_share = 1;
  cpu.shared_core = true;
  const auto p = simulate_step(timeline(0, 10, 0), {{1, 2}}, [](double) { return 4.0; }, 0, cpu);
  EXPECT_DOUBLE_EQ(p.buckets[0].end_ms, 10);
  EXPECT_DOUBLE_EQ(p.sharing_ms, 4);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 0);
  EXPECT_DOUBLE_EQ(p.step_ms, 14);
  // With a spare core nothing is shared.
  cpu.shared_core = false;
  const auto spare = simulate_step(timeline(0, 10, 0), {{1, 2}}, [](double) { return 4.0; }, 0, cpu);
  EXPECT_DOUBLE_EQ(spare.sharing_ms, 0);
  EXPECT_DOUBLE_EQ(spare.step_ms, 10);
}

TEST(StepSimulation, ACollectiveThatNeedsAQuarterOfTheCoreTakesAQuarterOfItsTimeFromBackward) {
  // Ready at once, 8 ms, a quarter of a core: it keeps its speed, backward
  // runs at 3/4 for 8 ms (6 done), then 4 alone: 12.
  CpuCosts cpu;
  cpu.comm_cpu_share = 0.25;
  cpu.shared_core = true;
  const auto p = simulate_step(timeline(0, 10, 0), {{1, 0}}, [](double) { return 8.0; }, 0, cpu);
  EXPECT_DOUBLE_EQ(p.buckets[0].end_ms, 8);
  EXPECT_DOUBLE_EQ(p.sharing_ms, 2);
  EXPECT_DOUBLE_EQ(p.step_ms, 12);
}

TEST(StepSimulation, ACollectivePastBackwardRunsAtFullSpeedOnceBackwardEnds) {
  // Ready at 8, 6 ms, busy: 8-12 both at half (backward reaches 10, the
  // collective has 4 left), then alone: 12-16, 4 exposed.
  CpuCosts cpu;
  cpu.comm_cpu_share = 1;
  cpu.shared_core = true;
  const auto p = simulate_step(timeline(0, 10, 0), {{1, 8}}, [](double) { return 6.0; }, 0, cpu);
  EXPECT_DOUBLE_EQ(p.sharing_ms, 2);
  EXPECT_DOUBLE_EQ(p.buckets[0].end_ms, 16);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 4);
  EXPECT_DOUBLE_EQ(p.step_ms, 16);
}

TEST(StepSimulation, AnAllReduceMeasuredBesideComputeRunsAtThatSpeedWhileBackwardRuns) {
  // As above, but measured beside compute at a quarter of its speed alone
  // (not the share's half): ready at 2, 4 ms alone. Backward still runs at
  // half its speed beside it.
  CpuCosts cpu;
  cpu.comm_cpu_share = 1;
  cpu.shared_core = true;
  cpu.speed_beside_compute = [](double) { return 0.25; };
  const auto p = simulate_step(timeline(0, 10, 0), {{1, 2}}, [](double) { return 4.0; }, 0, cpu);
  // 2-18: the collective at a quarter (4 ms of work: 16 ms), backward at
  // half (8 of its 8 ms left: it ends at 18 too).
  EXPECT_DOUBLE_EQ(p.buckets[0].end_ms, 18);
  EXPECT_DOUBLE_EQ(p.sharing_ms, 8);
  EXPECT_DOUBLE_EQ(p.step_ms, 18);
  // Without a shared core the measured speed does not apply.
  cpu.shared_core = false;
  EXPECT_DOUBLE_EQ(simulate_step(timeline(0, 10, 0), {{1, 2}}, [](double) { return 4.0; }, 0, cpu).step_ms, 10);
}

TEST(StepSimulation, TheSpeedBesideComputeIsTheIdleFitsTimeOverTheBusyOnes) {
  Scenario s;
  s.cluster.algorithm = Algorithm::shm;
  s.cluster.intra = s.cluster.inter = Link::from_bandwidth(0, 4);
  s.cluster.ranks_per_host = 8;
  s.cluster.comm_cpu_share = 1;
  s.cluster.cores_per_rank = 1;
  EXPECT_FALSE(cpu_costs(s, 2).speed_beside_compute);  // not calibrated: the share's rate
  s.cluster.allreduce_beside_compute = {true, Link::from_bandwidth(0, 1), 0};
  const CpuCosts cpu = cpu_costs(s, 2);
  ASSERT_TRUE(cpu.speed_beside_compute);
  EXPECT_NEAR(cpu.speed_beside_compute(16e6), 0.25, 1e-12);
  Scenario tcp = s;  // tcp's waits block in the kernel: the share's rate there
  tcp.cluster.algorithm = Algorithm::tcp;
  EXPECT_FALSE(cpu_costs(tcp, 2).speed_beside_compute);
  s.cluster.cores_per_host = 2;  // four ranks on two cores take turns, which charge the competition
  EXPECT_TRUE(cpu_costs(s, 2).speed_beside_compute);
  EXPECT_FALSE(cpu_costs(s, 4).speed_beside_compute);
  s.hook = "fp16";  // the hooks reduce 16-bit copies of their own: the share's rate
  EXPECT_FALSE(cpu_costs(s, 2).speed_beside_compute);
}

TEST(StepSimulation, CpuCostsComeFromTheClusterAndTheScenario) {
  Scenario s;
  s.cluster.copy_gb_per_s = 5;
  s.cluster.comm_cpu_share = 0.8;
  s.cluster.cores_per_rank = 1;
  auto cpu = cpu_costs(s, 2);
  EXPECT_TRUE(cpu.shared_core);
  EXPECT_DOUBLE_EQ(cpu.comm_cpu_share, 0.8);
  EXPECT_FALSE(cpu_costs(s, 1).shared_core);
  s.cluster.cores_per_rank = 2;  // a core for backward, one for the collectives
  EXPECT_FALSE(cpu_costs(s, 2).shared_core);
  s.cluster.cores_per_rank = 0;  // unknown: as on the presets, nothing shared
  EXPECT_FALSE(cpu_costs(s, 2).shared_core);
}

// The cores a rank has are those at the world size predicted: calibrated at
// 2 ranks on a host of 4 cores (2 each, one spare), 4 and 8 ranks there have
// one core or half of one, which backward shares with the collectives.
TEST(StepSimulation, TheSharedCoreIsJudgedAtTheWorldSizePredicted) {
  Scenario s;
  s.cluster.comm_cpu_share = 1;
  s.cluster.cores_per_rank = 2;
  s.cluster.cores_per_host = 4;
  s.cluster.ranks_per_host = 8;
  EXPECT_FALSE(cpu_costs(s, 2).shared_core);
  EXPECT_TRUE(cpu_costs(s, 4).shared_core);
  EXPECT_TRUE(cpu_costs(s, 8).shared_core);
  s.cluster.ranks_per_host = 2;  // 4 ranks on two such hosts: two cores each again
  EXPECT_FALSE(cpu_costs(s, 4).shared_core);
}

// Four ranks on a host of two cores: a profile of one rank's compute alone
// takes turns with another rank on its core, so the step is at least twice
// its compute and the collectives' share of a core; a --compute-trace of the
// four ranks (with_compute_of) has the turns in it already.
TEST(StepSimulation, RanksBeyondTheHostsCoresTakeTurnsUnlessTheProfileTimedThem) {
  Workload w = timeline(10, 20, 5);
  w.gradients = {{4e6, 10}, {4e6, 20}};
  Scenario s;
  s.cluster.ranks_per_host = 4;
  s.cluster.comm_cpu_share = 1;
  s.cluster.cores_per_rank = 1;
  const ScalePrediction unknown = predict(w, s, 4);
  const Scenario cores_unknown = s;
  s.cluster.cores_per_host = 2;
  const ScalePrediction turns = predict(w, s, 4);
  EXPECT_DOUBLE_EQ(turns.step_ms, 2 * (35 + turns.step.comm_ms));
  EXPECT_DOUBLE_EQ(turns.step.sharing_ms, turns.step_ms - unknown.step_ms + unknown.step.sharing_ms);
  EXPECT_NEAR(turns.efficiency, 35 / turns.step_ms, 1e-12);  // one rank alone takes no turns
  EXPECT_DOUBLE_EQ(predict(w, s, 2).step_ms, predict(w, cores_unknown, 2).step_ms) << "a core each: no turns";
  const Workload timed = with_compute_of(w, timeline(10, 20, 5));
  EXPECT_TRUE(timed.compute_shares_cores);
  EXPECT_DOUBLE_EQ(predict(timed, s, 4).step_ms, unknown.step_ms);
  s.accumulation = 3;  // the no_sync micro-batches take turns too
  EXPECT_DOUBLE_EQ(predict(w, s, 4).step_ms, turns.step_ms + 2 * 2 * 30);
}

// reducer.cc: after the first step the reducer reduces out of place from
// the set of buckets backward wrote into the other set (or, with bucket
// views, in place): no copy into the buckets and none back, with or
// without gradient_as_bucket_view, whatever the memory copy rate.
TEST(StepSimulation, PlainAllReducesChargeNoBucketCopiesInEitherMode) {
  Scenario s;
  s.cluster.copy_gb_per_s = 5;
  for (bool view : {false, true}) {
    s.bucket_view = view;
    const CpuCosts cpu = cpu_costs(s, 2);
    EXPECT_DOUBLE_EQ(cpu.copy_us_per_byte, 0) << view;
    EXPECT_DOUBLE_EQ(cpu.copy_back_us_per_byte, 0) << view;
  }
  Workload w = timeline(10, 20, 0);
  w.gradients = {{100e6, 20}};
  s.cluster = flat(Algorithm::ring, 0, 1e-6);
  s.cluster.copy_gb_per_s = 10;
  s.bucket_view = false;
  const double copying = predict(w, s, 2).step_ms;
  s.bucket_view = true;
  EXPECT_DOUBLE_EQ(predict(w, s, 2).step_ms, copying);
  EXPECT_DOUBLE_EQ(predict(w, s, 2).step.copy_ms, 0);
}

// The fp16 / bf16 hooks narrow each bucket on the compute thread, reduce
// the 16-bit copy at its own calibrated rate (ordinary buffers, not the
// shared buckets) and widen the result before the next all-reduce.
TEST(StepSimulation, HookChargesItsConversionsAndItsOwnReductionRate) {
  Workload w = timeline(0, 10, 0);
  w.gradients = {{4e6, 10}};  // one bucket of 4 MB, ready at the end of backward
  Scenario s;
  s.cluster = flat(Algorithm::ring, 0, 1e-3);  // fp32: 1 GB/s
  s.cluster.fp16.calibrated = true;
  s.cluster.fp16.link = Link{0, 4e-3};     // 16-bit, ordinary buffers: 0.25 GB/s
  s.cluster.fp16.narrow_gb_per_s = 2;      // 4 MB: 2 ms
  s.cluster.fp16.widen_gb_per_s = 4;       // 4 MB: 1 ms
  s.hook = "fp16";
  // 2 ranks, ring: wire = 1 x 2 MB at 4 us/KB = 8 ms, + 1 ms widening.
  EXPECT_DOUBLE_EQ(bucket_allreduce_ms(s, 2, 4e6), 8 + 1);
  EXPECT_DOUBLE_EQ(cpu_costs(s, 2).copy_us_per_byte, 1e-3 / 2);
  const auto p = predict(w, s, 2);
  EXPECT_DOUBLE_EQ(p.step.copy_ms, 2);
  EXPECT_DOUBLE_EQ(p.step.buckets[0].start_ms, 12);
  EXPECT_DOUBLE_EQ(p.step.exposed_ms, 9);
  EXPECT_DOUBLE_EQ(p.step_ms, 10 + 2 + 9);
  // Uncalibrated (bf16 here): the fp32 link at half the bytes, free conversions.
  s.hook = "bf16";
  EXPECT_DOUBLE_EQ(bucket_allreduce_ms(s, 2, 4e6), 2);
  EXPECT_DOUBLE_EQ(cpu_costs(s, 2).copy_us_per_byte, 0);
  // A world of one runs no hook.
  s.hook = "fp16";
  EXPECT_DOUBLE_EQ(bucket_allreduce_ms(s, 1, 4e6), 0);
  EXPECT_DOUBLE_EQ(predict(w, s, 1).step_ms, 10);
}

TEST(StepSimulation, BottleneckNamesCommunicationsCpuWhenItIsTheLargestCost) {
  Workload w = timeline(10, 20, 0);
  w.gradients = {{100e6, 20}};
  Scenario s;
  s.cluster = flat(Algorithm::ring, 0, 1e-6);  // 100 MB at 1000 GB/s: 0.2 ms
  s.cluster.bf16.calibrated = true;
  s.cluster.bf16.link = Link{0, 1e-6};
  s.cluster.bf16.narrow_gb_per_s = 5;  // 20 ms on the compute thread
  s.hook = "bf16";
  const auto p = predict(w, s, 2);
  EXPECT_DOUBLE_EQ(p.step.copy_ms, 20);
  const std::string text = bottleneck(w, s, p);
  EXPECT_NE(text.find("Communication's CPU"), std::string::npos) << text;
  EXPECT_NE(text.find("bf16 hook's narrowing"), std::string::npos) << text;
}

TEST(StepSimulation, StragglersAreTheExpectedSlowestOfNNormalDraws) {
  EXPECT_EQ(straggler_ms(100, 0.05, 1), 0);
  // Known in closed form: 1/sqrt(pi) for two draws, 3/(2 sqrt(pi)) for three.
  const double pi = std::acos(-1.0);
  EXPECT_NEAR(expected_max_of_normals(2), 1 / std::sqrt(pi), 1e-6);
  EXPECT_NEAR(expected_max_of_normals(3), 1.5 / std::sqrt(pi), 1e-6);
  EXPECT_NEAR(straggler_ms(100, 0.05, 2), 5 / std::sqrt(pi), 1e-5);
  // Tabulated: 1.16296 for 5, 3.24144 for 1000; below sqrt(2 ln n), growing.
  EXPECT_NEAR(expected_max_of_normals(5), 1.16296, 1e-4);
  EXPECT_NEAR(expected_max_of_normals(1000), 3.24144, 1e-3);
  double before = 0;
  for (int n : {2, 8, 64, 1024, 1 << 20}) {
    EXPECT_GT(expected_max_of_normals(n), before);
    EXPECT_LT(expected_max_of_normals(n), std::sqrt(2 * std::log(static_cast<double>(n))));
    before = expected_max_of_normals(n);
  }
}

TEST(StepSimulation, AccumulationAddsComputeOnlyMicroBatches) {
  Workload w = timeline(10, 20, 0);
  w.batch = 8;
  w.gradients = {{1e6, 20}};
  Scenario s;
  s.cluster = flat(Algorithm::ring, 0, 1e-3);  // 1 MB at 1 GB/s on 2 ranks: 1 ms
  s.accumulation = 4;
  const auto p = predict(w, s, 2);
  EXPECT_DOUBLE_EQ(p.step.exposed_ms, 1);
  EXPECT_DOUBLE_EQ(p.step_ms, 3 * 30 + 30 + 1);
  EXPECT_DOUBLE_EQ(p.samples_per_s, 8 * 4 * 2 * 1000 / p.step_ms);
  EXPECT_DOUBLE_EQ(p.efficiency, 120 / p.step_ms);
}

// Four runs' compute of one job (a machine whose speed moved between
// runs): the interval is the fastest and the slowest run's step, and the
// run standing for the job is the median one (the lower middle of four).
TEST(StepSimulation, ProfiledRunsGiveTheStepItsIntervalAndTheMedianRun) {
  Scenario s;
  s.cluster = flat(Algorithm::ring, 0, 1e-3);  // 1 MB at 1 GB/s on 2 ranks: 1 ms
  std::vector<Workload> runs;
  for (double backward : {24.0, 20.0, 30.0, 22.0}) {
    runs.push_back(timeline(10, backward, 0));
    runs.back().gradients = {{1e6, backward}};  // ready as backward ends: 1 ms exposed
  }
  const auto interval = step_interval(runs, s, 2);
  EXPECT_DOUBLE_EQ(interval.low_ms, 10 + 20 + 1);
  EXPECT_DOUBLE_EQ(interval.high_ms, 10 + 30 + 1);
  EXPECT_EQ(interval.typical, 3u);  // 20 < 22 < 24 < 30: the second
  EXPECT_EQ(step_interval({runs[2]}, s, 2).typical, 0u);
  EXPECT_DOUBLE_EQ(step_interval({runs[2]}, s, 2).low_ms, step_interval({runs[2]}, s, 2).high_ms);
  EXPECT_THROW(step_interval({}, s, 2), InvalidArgument);
}

TEST(StepSimulation, RecommendsSmallerBucketsWhenOneBucketIsAllExposed) {
  // Ten 10 MB gradients ready evenly through a 100 ms backward; one huge
  // bucket sends everything after backward, 25 MB buckets overlap.
  Workload w = timeline(50, 100, 0);
  for (int i = 1; i <= 10; ++i) w.gradients.push_back({10e6, 10.0 * i});
  Scenario s;
  s.cluster = flat(Algorithm::ring, 5, 1e-4);
  s.bucket_cap_mb = 1e6;
  const auto r = recommend(w, s, 8);
  EXPECT_LT(r.bucket_cap_mb, 1e6);
  EXPECT_LT(r.step_ms, r.default_step_ms);
}

// --- workloads --------------------------------------------------------------

TEST(Workload, PlanMatchesDdpsBucketPlanner) {
  const Description mlp = builtin_description("mlp");
  std::vector<ParamSpec> params;
  for (double p : mlp.layer_parameters) params.push_back({"p", static_cast<std::size_t>(p), DType::f32});
  const Workload w = from_description(mlp);
  for (double cap_mb : {1.0, 5.0, 25.0, 40.0, 100.0}) {
    BucketPlanOptions options;
    options.bucket_cap_bytes = static_cast<std::size_t>(cap_mb * (1 << 20));
    const auto expected = plan_buckets(params, reverse_order(params.size()), options);
    const auto planned = plan(w.gradients, cap_mb * (1 << 20));
    ASSERT_EQ(planned.size(), expected.size()) << cap_mb << " MB";
    for (std::size_t i = 0; i < planned.size(); ++i) EXPECT_DOUBLE_EQ(planned[i].bytes, expected[i].bytes());
  }
}

TEST(Workload, DescriptionReadiesGradientsInBackwardOrderByComputeShare) {
  Description d;
  d.layer_parameters = {100, 300};
  d.layer_compute = {3, 1};
  d.ms_per_sample = 1.5;
  d.batch = 2;
  const Workload w = from_description(d);
  EXPECT_DOUBLE_EQ(w.forward_ms, 1);
  EXPECT_DOUBLE_EQ(w.backward_ms, 2);
  ASSERT_EQ(w.gradients.size(), 2u);
  EXPECT_DOUBLE_EQ(w.gradients[0].bytes, 1200);  // the last layer first
  EXPECT_DOUBLE_EQ(w.gradients[0].ready_ms, 0.5);
  EXPECT_DOUBLE_EQ(w.gradients[1].ready_ms, 2);
}

class ProfileFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("lockstep-simulate-test-{}", ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

// Three steps of rank 0 (and a rank 1 to ignore): forward 10, backward 20
// (starting at 10), wait 2, between 3; bucket 0 (1 MiB) launched 5 ms and
// bucket 1 (2 MiB) 20 ms into backward. The first step is skipped.
std::string trace_text() {
  std::string events;
  for (int step = 0; step < 3; ++step) {
    const double t = step * 100000 + (step == 0 ? 50000 : 0);  // the first step is slow
    const auto ev = [&](const char* name, const char* cat, double ts, double dur, int pid) {
      events += fmt::format("{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{},\"tid\":0}},",
                            name, cat, ts, dur, pid);
    };
    ev("forward", "step", t, 10000, 0);
    ev("backward", "step", t + 10000, 20000, 0);
    ev("wait for gradients", "step", t + 30000, 2000, 0);
    ev("bucket 0 (1.00 MiB)", "buckets", t + 15000, 3000, 0);
    ev("bucket 1 (2.00 MiB)", "buckets", t + 30000, 2000, 0);
    ev("between steps (optimizer, data, ...)", "step", t + 32000, 3000, 0);
    ev("forward", "step", t, 99000, 1);
  }
  events += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0}";
  return "{\"traceEvents\":[" + events + "]}";
}

TEST_F(ProfileFiles, TraceGivesStepPartsAndBucketReadyTimes) {
  const Workload w = from_trace(write("t.rank0.json", trace_text()), 0, /*skip=*/1);
  EXPECT_DOUBLE_EQ(w.forward_ms, 10);
  EXPECT_DOUBLE_EQ(w.backward_ms, 20);
  EXPECT_DOUBLE_EQ(w.other_ms, 3);
  ASSERT_EQ(w.gradients.size(), 2u);
  EXPECT_DOUBLE_EQ(w.gradients[0].bytes, 1 << 20);
  EXPECT_DOUBLE_EQ(w.gradients[0].ready_ms, 5);
  EXPECT_DOUBLE_EQ(w.gradients[1].ready_ms, 20);
}

TEST_F(ProfileFiles, ComputeFromAnotherTraceStretchesReadyTimes) {
  const Workload timeline = from_trace(write("t.rank0.json", trace_text()), 0, 1);
  Workload compute = timeline;
  compute.forward_ms = 15;
  compute.backward_ms = 40;
  compute.other_ms = 1;
  const Workload w = with_compute_of(timeline, compute);
  EXPECT_DOUBLE_EQ(w.forward_ms, 15);
  EXPECT_DOUBLE_EQ(w.other_ms, 1);
  EXPECT_DOUBLE_EQ(w.gradients[0].ready_ms, 10);
  EXPECT_DOUBLE_EQ(w.gradients[1].ready_ms, 40);
}

TEST_F(ProfileFiles, NoSyncTraceGivesForwardAndTheRestUpToTheNextForward) {
  // As DDP writes it under no_sync: backward and the wait untimed (at 0).
  std::string events;
  for (int step = 0; step < 4; ++step) {
    const double t = 1000000 + step * 50000;
    events += fmt::format(R"({{"name":"forward","cat":"step","ph":"X","ts":{},"dur":10000,"pid":0}},)", t);
    events += R"({"name":"backward","cat":"step","ph":"X","ts":0,"dur":0,"pid":0},)";
    events += R"({"name":"wait for gradients","cat":"step","ph":"X","ts":0,"dur":0,"pid":0},)";
  }
  events.pop_back();
  const Workload compute = from_trace(write("ns.rank0.json", "{\"traceEvents\":[" + events + "]}"), 0, 1);
  EXPECT_DOUBLE_EQ(compute.forward_ms, 10);
  EXPECT_DOUBLE_EQ(compute.backward_ms, 0);
  EXPECT_DOUBLE_EQ(compute.other_ms, 40);
  // Split as the timeline splits backward (20) and rest (3).
  const Workload timeline = from_trace(write("t.rank0.json", trace_text()), 0, 1);
  const Workload w = with_compute_of(timeline, compute);
  EXPECT_NEAR(w.backward_ms, 40.0 * 20 / 23, 1e-12);
  EXPECT_NEAR(w.other_ms, 40.0 * 3 / 23, 1e-12);
  EXPECT_NEAR(w.gradients[1].ready_ms, 20 * w.backward_ms / 20, 1e-12);
}

TEST_F(ProfileFiles, JitterIsTheRobustSpreadOfEveryRanksSteps) {
  // Two ranks, in two files; after 2 warm-up steps each rank's steps take
  // 90 and 110 ms, four times each, and one disturbed step (500 ms on rank
  // 0, 10 ms on rank 1) that the median absolute deviation ignores:
  // median 100, deviation 10.
  const auto trace = [&](const std::string& name, int pid, int offset, double disturbed) {
    std::string events;
    double t = 1000000;
    for (int step = 0; step < 12; ++step) {
      events += fmt::format(R"({{"name":"forward","cat":"step","ph":"X","ts":{},"dur":10000,"pid":{}}},)", t, pid);
      t += 1000 * (step == 10 ? disturbed : (step + offset) % 2 ? 110 : 90);
    }
    events.pop_back();
    return write(name, "{\"traceEvents\":[" + events + "]}");
  };
  const std::vector<std::string> files{trace("j.rank0.json", 0, 0, 500), trace("j.rank1.json", 1, 1, 10)};
  EXPECT_NEAR(compute_jitter(files), 1.4826 * 10 / 100, 1e-9);
  EXPECT_THROW(compute_jitter({write("empty.json", R"({"traceEvents":[]})")}), Error);
}

TEST_F(ProfileFiles, TraceWithoutStepsSaysHowToGetOne) {
  EXPECT_THROW(from_trace(write("empty.json", "{\"traceEvents\":[]}")), Error);
  EXPECT_THROW(from_trace((dir_ / "missing.json").string()), ConfigError);
}

TEST_F(ProfileFiles, RefinedGradientsFollowTheMeasuredCurve) {
  const Workload measured = from_trace(write("t.rank0.json", trace_text()), 0, 1);
  Description d;  // three tensors of 0.5, 0.5 and 2 MiB (in backward order: 2 MiB last)
  d.layer_parameters = {512 * 1024, 128 * 1024, 128 * 1024};
  const Workload w = refine_gradients(measured, d);
  ASSERT_EQ(w.gradients.size(), 3u);
  EXPECT_DOUBLE_EQ(w.gradients[0].ready_ms, 2.5);  // half of bucket 0's MiB: half of its 5 ms
  EXPECT_DOUBLE_EQ(w.gradients[1].ready_ms, 5);
  EXPECT_DOUBLE_EQ(w.gradients[2].ready_ms, 20);
}

TEST_F(ProfileFiles, StatsGiveComputeDataAndBuckets) {
  const Workload w = from_stats(write("s.rank0.json", R"({"compute_ms": 30, "data_ms": 4,
      "buckets": [{"parameters": 1, "bytes": 100}, {"parameters": 2, "bytes": 300}]})"));
  EXPECT_DOUBLE_EQ(w.forward_ms, 10);
  EXPECT_DOUBLE_EQ(w.backward_ms, 20);
  EXPECT_DOUBLE_EQ(w.data_ms, 4);
  ASSERT_EQ(w.gradients.size(), 2u);
  EXPECT_DOUBLE_EQ(w.gradients[0].ready_ms, 5);
  EXPECT_DOUBLE_EQ(w.gradients[1].ready_ms, 20);
}

// --- calibration ------------------------------------------------------------

std::vector<cli::BenchRow> synthetic(Algorithm a, const Link& l, double gamma, std::initializer_list<int> ranks) {
  std::vector<cli::BenchRow> rows;
  for (int n : ranks)
    for (double s = 64 * 1024; s <= 64 << 20; s *= 2)
      rows.push_back({n, "x", "allreduce", s, cost_us(flat_terms(a, n, s), l, gamma, s)});
  return rows;
}

TEST(Calibration, RecoversAlphaAndBetaOfARing) {
  const Link truth = Link::from_bandwidth(20, 2.5);
  const Fit f = fit_allreduce(synthetic(Algorithm::ring, truth, 0, {2, 4, 8}), Algorithm::ring);
  EXPECT_NEAR(f.link.alpha_us, 20, 1e-6);
  EXPECT_NEAR(f.link.gb_per_s(), 2.5, 1e-9);
  EXPECT_FALSE(f.gamma_separate);  // a ring reduces half of what it sends at any n
  EXPECT_LT(f.max_error, 1e-9);
}

TEST(Calibration, SeparatesTheReductionWhenWorldSizesTellItApart) {
  const Link truth = Link::from_bandwidth(3, 8);
  const double gamma = 1e-3 / 4;  // 4 GB/s
  const Fit f = fit_allreduce(synthetic(Algorithm::one_shot, truth, gamma, {2, 4, 8}), Algorithm::one_shot);
  EXPECT_TRUE(f.gamma_separate);
  EXPECT_NEAR(f.link.alpha_us, 3, 1e-6);
  EXPECT_NEAR(f.link.gb_per_s(), 8, 1e-6);
  EXPECT_NEAR(f.gamma_us_per_byte, gamma, 1e-12);
}

TEST(Calibration, FitsTheBackendsLargeMessageRowsWithNoise) {
  // The shm backend's two-shot at 2 ranks, +-3% noise alternating.
  auto rows = synthetic(Algorithm::shm, Link::from_bandwidth(4, 6), 0, {2});
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i].time_us *= i % 2 ? 1.03 : 0.97;
  // Two-shot's per-round latency grows with the size as its bytes do, so
  // alpha and beta trade off under noise; the predicted times must not.
  const Link truth = Link::from_bandwidth(4, 6);
  const Fit f = fit_allreduce(rows, Algorithm::shm, 256 * 1024 + 1);
  EXPECT_LT(f.mean_error, 0.05);
  for (double s : {1e6, 16e6, 100e6}) {
    const double want = cost_us(flat_terms(Algorithm::shm, 2, s), truth, 0, s);
    EXPECT_NEAR(cost_us(flat_terms(Algorithm::shm, 2, s), f.link, f.gamma_us_per_byte, s), want, 0.04 * want) << s;
  }
}

TEST(Calibration, LeavesOutRowsADisturbedMachineMadeFastOrSlow) {
  // A 2-rank ring at 2.5 GB/s; two of eleven rows measured while the
  // machine was busy (3x slower) or had a quiet moment (4x faster).
  auto rows = synthetic(Algorithm::ring, Link::from_bandwidth(20, 2.5), 0, {2});
  rows[3].time_us *= 3;
  rows[7].time_us /= 4;
  const Fit f = fit_allreduce(rows, Algorithm::ring);
  EXPECT_EQ(f.outliers, 2u);
  EXPECT_NEAR(f.link.gb_per_s(), 2.5, 1e-6);
  EXPECT_NEAR(f.link.alpha_us, 20, 1e-4);
}

TEST(Calibration, TooFewRowsIsAnError) {
  EXPECT_THROW(fit_allreduce({{2, "shm", "allreduce", 1e6, 100}}, Algorithm::ring), InvalidArgument);
}

TEST(Calibration, ReadsBenchTablesAndJson) {
  const std::string table =
      "# lockstep bench: 2 ranks, backend shm, 20 iterations after 5 warm-up, check on, private buffers\n"
      "#\n#       size        count     type  redop   root       time    algbw    busbw   #wrong\n"
      "#        (B)   (elements)                              (us)   (GB/s)   (GB/s)\n"
      "      262144        65536    float    sum     -1      40.00     6.55     6.55        0\n"
      "     1048576       262144    float    sum     -1     150.50    6.97     6.97        0\n"
      "# Out of bounds values : 0 OK\n";
  const auto rows = cli::parse_bench_output(table);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].ranks, 2);
  EXPECT_EQ(rows[1].backend, "shm");
  EXPECT_EQ(rows[1].op, "allreduce");
  EXPECT_DOUBLE_EQ(rows[1].bytes, 1048576);
  EXPECT_DOUBLE_EQ(rows[1].time_us, 150.5);
  const auto json = cli::parse_bench_output(
      R"({"backend": "tcp", "ranks": 4, "results": [{"op": "allreduce", "size": 1024, "time_us": 12.5}]})");
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0].ranks, 4);
  EXPECT_DOUBLE_EQ(json[0].time_us, 12.5);
  EXPECT_THROW(cli::parse_bench_output("no rows here"), ConfigError);
  EXPECT_EQ(rows[1].busy, 0);
}

// Rows measured with processes spinning beside the ranks say so, in either
// format: the calibration keeps them apart from the idle machine's.
TEST(Calibration, ReadsTheBusyProcessesBesideTheRanks) {
  const std::string table =
      "# lockstep bench: 2 ranks, backend shm, 10 iterations after 3 warm-up, check on, ordinary buffers, in place, "
      "2 busy process(es) beside the ranks\n"
      "#\n# allgather\n"
      "     1048576       262144    float   none     -1     300.00    3.50     1.75        0\n";
  const auto rows = cli::parse_bench_output(table);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].busy, 2);
  EXPECT_EQ(rows[0].op, "allgather");
  const auto json = cli::parse_bench_output(
      R"({"backend": "shm", "ranks": 2, "busy": 3, "results": [{"op": "allgather", "size": 1024, "time_us": 10}]})");
  EXPECT_EQ(json.at(0).busy, 3);
}

TEST(Calibration, TakesTheCpuTermsFromBenchJson) {
  const auto rows = cli::parse_bench_output(
      R"({"backend": "tcp", "ranks": 2, "memcpy_gbps": 4.5, "cores_per_rank": 1,
          "results": [{"op": "allreduce", "size": 1024, "time_us": 10, "cpu_us": 10},
                      {"op": "allreduce", "size": 8388608, "time_us": 1000, "cpu_us": 300},
                      {"op": "allreduce", "size": 16777216, "time_us": 2000, "cpu_us": 700},
                      {"op": "allreduce", "size": 33554432, "time_us": 4000, "cpu_us": 1600}]})");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_DOUBLE_EQ(rows[0].memcpy_gb_per_s, 4.5);
  EXPECT_DOUBLE_EQ(rows[0].cores_per_rank, 1);
  EXPECT_DOUBLE_EQ(rows[1].cpu_us, 300);
  // The median share of the rows from 8 MiB: 0.3, 0.35, 0.4.
  EXPECT_DOUBLE_EQ(comm_cpu_share(rows, 8 << 20), 0.35);
  // Tables carry no CPU times: nothing to say.
  EXPECT_DOUBLE_EQ(comm_cpu_share({{2, "shm", "allreduce", 1e7, 100}}), 0);
}

TEST(Calibration, ClusterFileRoundTrips) {
  Cluster c = preset("dgx-h100");
  const Cluster back = parse_cluster_json(cluster_json(c));
  EXPECT_EQ(back.name, c.name);
  EXPECT_EQ(back.ranks_per_host, 8);
  EXPECT_EQ(back.algorithm, Algorithm::hierarchical);
  EXPECT_NEAR(back.inter.gb_per_s(), c.inter.gb_per_s(), 1e-9);
  EXPECT_NEAR(back.intra.alpha_us, c.intra.alpha_us, 1e-12);
  EXPECT_DOUBLE_EQ(back.cores_per_rank, 0);  // the presets leave the CPU terms out
  c.copy_gb_per_s = 4.5;
  c.comm_cpu_share = 0.25;
  c.cores_per_rank = 1;
  c.cores_per_host = 2;
  const Cluster cpu = parse_cluster_json(cluster_json(c));
  EXPECT_DOUBLE_EQ(cpu.copy_gb_per_s, 4.5);
  EXPECT_DOUBLE_EQ(cpu.comm_cpu_share, 0.25);
  EXPECT_DOUBLE_EQ(cpu.cores_per_rank, 1);
  EXPECT_DOUBLE_EQ(cpu.cores_per_host, 2);
  // A file from before cores_per_host: not known, cores_per_rank stands.
  EXPECT_DOUBLE_EQ(parse_cluster_json(R"({"intra": {"gb_per_s": 1}, "cores_per_rank": 1})").cores_per_host, 0);
  EXPECT_THROW(parse_cluster_json(R"({"intra": {"gb_per_s": 1}, "cores_per_host": -2})"), ConfigError);
  EXPECT_THROW(parse_cluster_json(R"({"intra": {"gb_per_s": 1}, "comm_cpu_share": 2})"), ConfigError);
  EXPECT_THROW(preset("nope"), InvalidArgument);
}

// bench --json rows of one run, as calibrate_cluster reads them.
std::vector<cli::BenchRow> bench_json(const std::string& dtype, const Link& l, double noise, int ranks_per_host,
                                      bool shared = true) {
  auto rows = synthetic(Algorithm::shm, l, 0, {2});
  for (std::size_t i = 0; i < rows.size(); ++i) {
    rows[i].backend = "shm";
    rows[i].dtype = dtype;
    rows[i].ranks_per_host = ranks_per_host;
    rows[i].shared_buffers = shared;
    rows[i].narrow_gb_per_s = dtype == "float" ? 0 : 3;
    rows[i].widen_gb_per_s = dtype == "float" ? 0 : 6;
    rows[i].time_us *= i % 2 ? 1 + noise : 1 - noise;
  }
  return rows;
}

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

TEST(Calibration, AGoodFitWarnsOfNothing) {
  const Calibration c = calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 6), 0.02, 2), "", -1, 0);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
  EXPECT_LT(c.cluster.fit_error, kPoorFitError);
  EXPECT_EQ(poor_fit_warning(0.1, "x"), "");
}

TEST(Calibration, APoorFitIsWarnedAboutWithWhatToDo) {
  // +-40% alternating: no line fits within 15%.
  const Calibration c = calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 6), 0.4, 2), "", -1, 0);
  ASSERT_TRUE(mentions(c.warnings, "fit is poor")) << c.warnings.size();
  EXPECT_TRUE(mentions(c.warnings, "quiet machine"));
  EXPECT_GT(c.cluster.fit_error, kPoorFitError);
  // ... and the cluster file carries the error, so --cluster warns again.
  EXPECT_DOUBLE_EQ(parse_cluster_json(cluster_json(c.cluster)).fit_error, c.cluster.fit_error);
  EXPECT_NE(poor_fit_warning(c.cluster.fit_error, "x").find("above 15%"), std::string::npos);
}

// The host's cores: the bench's cores per rank times its ranks on the
// host, whatever --ranks-per-host then says of the cluster.
TEST(Calibration, TheHostsCoresComeFromTheBenchRun) {
  auto rows = bench_json("float", Link::from_bandwidth(4, 6), 0, 2);
  for (auto& r : rows) r.cores_per_rank = 1;
  const Calibration c = calibrate_cluster(rows, "", -1, 4);
  EXPECT_DOUBLE_EQ(c.cluster.cores_per_host, 2);
  EXPECT_DOUBLE_EQ(cores_per_rank_at(c.cluster, 4), 0.5);
  EXPECT_DOUBLE_EQ(cores_per_rank_at(c.cluster, 2), 1);
  for (auto& r : rows) r.cores_per_rank = 0;  // not recorded
  EXPECT_DOUBLE_EQ(calibrate_cluster(rows, "", -1, 4).cluster.cores_per_host, 0);
}

TEST(Calibration, RanksPerHostComeFromTheBenchRun) {
  // Two hosts with one rank each: the bench run says 1, not its world of 2.
  EXPECT_EQ(calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 6), 0, 1), "", -1, 0).cluster.ranks_per_host,
            1);
  EXPECT_EQ(calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 6), 0, 2), "", -1, 0).cluster.ranks_per_host,
            2);
  // The option wins; a table (0: not recorded) takes its world, and says so.
  EXPECT_EQ(calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 6), 0, 1), "", -1, 4).cluster.ranks_per_host,
            4);
  const Calibration table = calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 6), 0, 0), "", -1, 0);
  EXPECT_EQ(table.cluster.ranks_per_host, 2);
  EXPECT_TRUE(mentions(table.notes, "ranks per host"));
}

TEST(Calibration, HalfAndBfloat16RowsCalibrateTheHooks) {
  auto rows = bench_json("float", Link::from_bandwidth(4, 6), 0, 2);
  const auto half = bench_json("half", Link::from_bandwidth(10, 1.5), 0, 2, /*shared=*/false);
  rows.insert(rows.end(), half.begin(), half.end());
  const Calibration c = calibrate_cluster(rows, "", -1, 0);
  // fp32 from the float rows alone (two-shot trades alpha for beta: compare times).
  const double fp32 = cost_us(flat_terms(Algorithm::shm, 2, 16e6), Link::from_bandwidth(4, 6), 0, 16e6);
  EXPECT_NEAR(allreduce_us(c.cluster, 2, 16e6), fp32, 0.02 * fp32);
  ASSERT_TRUE(c.cluster.fp16.calibrated);
  EXPECT_FALSE(c.cluster.bf16.calibrated);
  EXPECT_TRUE(mentions(c.notes, "--hook bf16: no 16-bit rows"));
  Scenario s;
  s.cluster = c.cluster;
  s.hook = "fp16";
  const double want = cost_us(flat_terms(Algorithm::shm, 2, 8e6), Link::from_bandwidth(10, 1.5), 0, 8e6);
  EXPECT_NEAR(bucket_allreduce_ms(s, 2, 16e6), (want + 16e6 * 1e-3 / 6) / 1000, 0.05 * want / 1000);
  const Cluster back = parse_cluster_json(cluster_json(c.cluster));
  EXPECT_TRUE(back.fp16.calibrated);
  EXPECT_DOUBLE_EQ(back.fp16.narrow_gb_per_s, 3);
  EXPECT_DOUBLE_EQ(back.fp16.widen_gb_per_s, 6);
  EXPECT_NEAR(back.fp16.link.gb_per_s(), c.cluster.fp16.link.gb_per_s(), 1e-9);
  // Half rows on shared buffers measure what the hook does not do.
  auto wrong = bench_json("float", Link::from_bandwidth(4, 6), 0, 2);
  const auto shared_half = bench_json("half", Link::from_bandwidth(10, 1.5), 0, 2, /*shared=*/true);
  wrong.insert(wrong.end(), shared_half.begin(), shared_half.end());
  EXPECT_TRUE(mentions(calibrate_cluster(wrong, "", -1, 0).warnings, "without --shared-buffers"));
  // Without fp32 rows there are no links to fit.
  EXPECT_THROW(calibrate_cluster(half, "", -1, 0), InvalidArgument);
}

// DDP's default reducer reduces out of place, gradient_as_bucket_view in
// place; on the shm backend the two run at different rates, so each mode
// takes its own fit when bench measured both.
TEST(Calibration, OutOfPlaceRowsCalibrateTheDefaultReducerAndViewsKeepTheInPlaceLinks) {
  auto rows = bench_json("float", Link::from_bandwidth(4, 10), 0, 2);
  auto out = bench_json("float", Link::from_bandwidth(4, 5), 0, 2);
  for (auto& r : out) r.out_of_place = true;
  rows.insert(rows.end(), out.begin(), out.end());
  const Calibration c = calibrate_cluster(rows, "", -1, 0);
  ASSERT_TRUE(c.cluster.out_of_place.calibrated);
  const double in_place_us = cost_us(flat_terms(Algorithm::shm, 2, 16e6), Link::from_bandwidth(4, 10), 0, 16e6);
  const double out_of_place_us = cost_us(flat_terms(Algorithm::shm, 2, 16e6), Link::from_bandwidth(4, 5), 0, 16e6);
  Scenario s;
  s.cluster = c.cluster;
  s.bucket_view = true;
  EXPECT_NEAR(bucket_allreduce_ms(s, 2, 16e6), in_place_us / 1000, 0.02 * in_place_us / 1000);
  s.bucket_view = false;
  EXPECT_NEAR(bucket_allreduce_ms(s, 2, 16e6), out_of_place_us / 1000, 0.02 * out_of_place_us / 1000);
  EXPECT_TRUE(mentions(c.notes, "out of place (DDP's default reducer)"));
  // The cluster file keeps it.
  const Cluster back = parse_cluster_json(cluster_json(c.cluster));
  ASSERT_TRUE(back.out_of_place.calibrated);
  EXPECT_NEAR(back.out_of_place.link.gb_per_s(), c.cluster.out_of_place.link.gb_per_s(), 1e-9);
  // Without out-of-place rows both modes take the in-place links, and say so.
  const Calibration only_in = calibrate_cluster(bench_json("float", Link::from_bandwidth(4, 10), 0, 2), "", -1, 0);
  EXPECT_FALSE(only_in.cluster.out_of_place.calibrated);
  EXPECT_TRUE(mentions(only_in.notes, "out of place: no rows"));
  s.cluster = only_in.cluster;
  EXPECT_NEAR(bucket_allreduce_ms(s, 2, 16e6), in_place_us / 1000, 0.02 * in_place_us / 1000);
  // Out-of-place rows alone fit the links, for both modes.
  const Calibration only_out = calibrate_cluster(out, "", -1, 0);
  EXPECT_FALSE(only_out.cluster.out_of_place.calibrated);
  EXPECT_TRUE(mentions(only_out.notes, "in place: no rows"));
  s.cluster = only_out.cluster;
  s.bucket_view = true;
  EXPECT_NEAR(bucket_allreduce_ms(s, 2, 16e6), out_of_place_us / 1000, 0.02 * out_of_place_us / 1000);
  // bench's output says which it measured.
  const auto parsed = cli::parse_bench_output(
      R"({"backend": "shm", "ranks": 2, "out_of_place": true, "results": [{"op": "allreduce", "size": 1024, "time_us": 10}]})");
  ASSERT_EQ(parsed.size(), 1u);
  EXPECT_TRUE(parsed[0].out_of_place);
  const auto table = cli::parse_bench_output(
      "# lockstep bench: 2 ranks, backend shm, 20 iterations after 5 warm-up, check on, shared buffers, out of place\n"
      "     1048576       262144    float    sum     -1      60.00    17.48    17.48       0\n");
  ASSERT_EQ(table.size(), 1u);
  EXPECT_TRUE(table[0].out_of_place);
  EXPECT_TRUE(table[0].shared_buffers);
}

TEST(Calibration, BenchJsonCarriesDtypeRanksPerHostAndConversionRates) {
  const auto rows = cli::parse_bench_output(
      R"({"backend": "shm", "ranks": 2, "dtype": "half", "ranks_per_host": 1, "shared_buffers": false,
          "narrow_gbps": 2.5, "widen_gbps": 5, "results": [{"op": "allreduce", "size": 1024, "time_us": 10}]})");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].dtype, "half");
  EXPECT_EQ(rows[0].ranks_per_host, 1);
  EXPECT_FALSE(rows[0].shared_buffers);
  EXPECT_DOUBLE_EQ(rows[0].narrow_gb_per_s, 2.5);
  EXPECT_DOUBLE_EQ(rows[0].widen_gb_per_s, 5);
}

TEST(Workload, RescalingTheBatchScalesForwardBackwardAndReadyTimesOnly) {
  Workload w = timeline(10, 20, 5);
  w.data_ms = 2;
  w.gradients = {{1e6, 4}, {1e6, 20}};
  w.batch = 32;
  const Workload big = rescale_batch(w, 128);
  EXPECT_EQ(big.batch, 128);
  EXPECT_DOUBLE_EQ(big.forward_ms, 40);
  EXPECT_DOUBLE_EQ(big.backward_ms, 80);
  EXPECT_DOUBLE_EQ(big.other_ms, 5);  // the optimizer does not see the batch
  EXPECT_DOUBLE_EQ(big.data_ms, 2);
  EXPECT_DOUBLE_EQ(big.gradients[0].ready_ms, 16);
  EXPECT_DOUBLE_EQ(big.gradients[1].ready_ms, 80);
  // A profile whose batch is not known cannot be rescaled.
  w.batch = 0;
  EXPECT_THROW(rescale_batch(w, 128), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::sim
