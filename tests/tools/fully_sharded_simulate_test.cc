// `lockstep simulate --strategy fsdp`: the all-gather and reduce-scatter
// costs against hand-computed cases and against the all-reduce they are
// the halves of; the fully sharded step of 1, 2 and 3 units at 2 and 4
// ranks against timelines worked out by hand (with and without prefetch,
// with and without resharding) and its memory; what it communicates
// against DDP's all-reduce; units from workloads and traces; calibration
// of the two collectives from `lockstep bench` rows.
//
// The hand-computed steps run on a ring with no latency at 0.5 us per
// byte: an all-gather or reduce-scatter of P fp32 elements takes P / 1000
// ms at 2 ranks ((n-1)/n x 4P bytes x 0.5 us) and 1.5 P / 1000 ms at 4.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include <fmt/format.h>

#include "common/bench_table.h"
#include "lockstep/error.h"
#include "simulate/calibration.h"
#include "simulate/cost_model.h"
#include "simulate/fully_sharded_report.h"
#include "simulate/fully_sharded_step.h"
#include "simulate/fully_sharded_workload.h"

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

Scenario half_microsecond_ring() {
  Scenario s;
  s.cluster = flat(Algorithm::ring, 0, 0.5);
  return s;
}

ShardedWorkload units_of(std::vector<ShardedUnit> units) {
  ShardedWorkload w;
  w.name = "hand";
  w.units = std::move(units);
  return w;
}

ShardingOptions sharding(int prefetch, bool reshard) {
  ShardingOptions o;
  o.prefetch = prefetch;
  o.reshard_after_forward = reshard;
  return o;
}

ShardedStepPrediction step(const ShardedWorkload& w, int ranks, const ShardingOptions& o) {
  return predict_sharded(w, half_microsecond_ring(), o, ranks).step;
}

// --- cost model -------------------------------------------------------------

TEST(ShardedCostModel, RingAllGatherAndReduceScatterAreTheRingAllReducesHalves) {
  for (int n : {2, 3, 4, 8}) {
    const CostTerms gather = allgather_terms(Algorithm::ring, n, 1e6);
    const CostTerms scatter = reduce_scatter_terms(Algorithm::ring, n, 1e6);
    const CostTerms all = flat_terms(Algorithm::ring, n, 1e6);
    EXPECT_DOUBLE_EQ(gather.steps + scatter.steps, all.steps) << n;
    EXPECT_DOUBLE_EQ(gather.wire + scatter.wire, all.wire) << n;
    EXPECT_DOUBLE_EQ(gather.reduced + scatter.reduced, all.reduced) << n;
    EXPECT_DOUBLE_EQ(gather.reduced, 0) << n;
  }
  // 4 ranks, 1 MB, 10 us per message, 1 GB/s, reduction 0.5 GB/s: 3 steps,
  // 3/4 of the buffer sent; the reduce-scatter also reduces 3/4 of it.
  const Cluster c = flat(Algorithm::ring, 10, 1e-3, 2e-3);
  EXPECT_DOUBLE_EQ(allgather_us(c, 4, 1e6), 30 + 750);
  EXPECT_DOUBLE_EQ(reduce_scatter_us(c, 4, 1e6), 30 + 750 + 1500);
}

TEST(ShardedCostModel, HalvingDoublingSplitsIntoItsTwoHalvesToo) {
  for (int n : {4, 6, 8}) {
    const CostTerms gather = allgather_terms(Algorithm::halving_doubling, n, 1e6);
    const CostTerms scatter = reduce_scatter_terms(Algorithm::halving_doubling, n, 1e6);
    const CostTerms all = flat_terms(Algorithm::halving_doubling, n, 1e6);
    EXPECT_DOUBLE_EQ(gather.steps + scatter.steps, all.steps) << n;
    EXPECT_DOUBLE_EQ(gather.wire + scatter.wire, all.wire) << n;
    EXPECT_DOUBLE_EQ(gather.reduced + scatter.reduced, all.reduced) << n;
  }
}

TEST(ShardedCostModel, TcpRunsTheRingAtEverySize) {
  // Unlike its all-reduce, the tcp backend has no small-message algorithm
  // for these two.
  const Cluster tcp = flat(Algorithm::tcp, 10, 1e-3), ring = flat(Algorithm::ring, 10, 1e-3);
  for (double bytes : {1e3, 64e3, 1e6}) {
    EXPECT_DOUBLE_EQ(allgather_us(tcp, 8, bytes), allgather_us(ring, 8, bytes)) << bytes;
    EXPECT_DOUBLE_EQ(reduce_scatter_us(tcp, 8, bytes), reduce_scatter_us(ring, 8, bytes)) << bytes;
  }
}

TEST(ShardedCostModel, ShmGoesThroughItsSlotsInRounds) {
  // 2 ranks, slots of 2 x 128 KiB. All-gather of a 1 MiB output: each
  // rank's 512 KiB input in 2 rounds; the whole output copied once.
  const double s = 1 << 20;
  const Cluster c = flat(Algorithm::shm, 1, 1e-3, 2e-3);
  EXPECT_DOUBLE_EQ(allgather_us(c, 2, s), 2 + s * 1e-3);
  // Reduce-scatter of a 1 MiB input: each 512 KiB block 128 KiB a round,
  // 4 rounds; half the input copied in, half reduced.
  EXPECT_DOUBLE_EQ(reduce_scatter_us(c, 2, s), 4 + 0.5 * s * 1e-3 + 0.5 * s * 2e-3);
  // Small buffers still take a round.
  EXPECT_DOUBLE_EQ(allgather_terms(Algorithm::shm, 4, 100).steps, 1);
}

TEST(ShardedCostModel, HierarchicalRunsAHostRingAndTheHostsRanks) {
  Cluster c;
  c.ranks_per_host = 4;
  c.intra = Link{1, 1e-4};
  c.inter = Link{10, 1e-2};
  c.algorithm = Algorithm::hierarchical;
  // 2 hosts x 4, 8 MB: a ring of 2 hosts on 2 MB (1 step, half of it),
  // and 4 ranks of a host on 8 MB (3 steps, 3/4 of it).
  const double s = 8e6;
  EXPECT_DOUBLE_EQ(allgather_us(c, 8, s), (10 + 0.5 * 2e6 * 1e-2) + (3 + 0.75 * s * 1e-4));
  EXPECT_DOUBLE_EQ(reduce_scatter_us(c, 8, s), allgather_us(c, 8, s));  // no reduction cost here
  // One host: the flat ring inside it.
  EXPECT_DOUBLE_EQ(allgather_us(c, 4, s), 3 + 0.75 * s * 1e-4);
}

TEST(ShardedCostModel, CalibratedLinksReplaceTheAllReducesForTheirCollectiveOnly) {
  Cluster c = flat(Algorithm::ring, 10, 1e-3);
  c.allgather = {true, Link{20, 2e-3}, 0};
  EXPECT_DOUBLE_EQ(allgather_us(c, 2, 1e6), 20 + 0.5 * 1e6 * 2e-3);
  EXPECT_DOUBLE_EQ(reduce_scatter_us(c, 2, 1e6), 10 + 0.5 * 1e6 * 1e-3);
}

TEST(ShardedCostModel, BusBytesAreNcclTestsFactors) {
  EXPECT_DOUBLE_EQ(allreduce_bus_bytes(4, 1000), 1500);
  EXPECT_DOUBLE_EQ(allgather_bus_bytes(4, 1000), 750);
  EXPECT_DOUBLE_EQ(reduce_scatter_bus_bytes(4, 1000), 750);
  EXPECT_DOUBLE_EQ(allgather_bus_bytes(1, 1000), 0);
}

// --- the step ---------------------------------------------------------------

TEST(ShardedStep, OneUnitIsTheRootGatheredOnceAndReducedAfterBackward) {
  // P = 1000, forward 2 ms, backward 4 ms. The root is not resharded, so
  // backward needs no all-gather: gather [0, 1], forward [1, 3], backward
  // [3, 7], reduce-scatter [7, 8].
  const ShardedWorkload w = units_of({{1000, 2, 4}});
  const auto p = step(w, 2, sharding(1, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 8);
  EXPECT_DOUBLE_EQ(p.compute_ms, 6);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 1);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 0);
  EXPECT_DOUBLE_EQ(p.tail_ms, 1);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 2);
  EXPECT_EQ(p.allgather.count, 1);
  EXPECT_EQ(p.reduce_scatter.count, 1);
  // 4 ranks: each collective takes 1.5 ms.
  const auto q = step(w, 4, sharding(1, true));
  EXPECT_DOUBLE_EQ(q.step_ms, 9);
  EXPECT_DOUBLE_EQ(q.exposed_ms, 3);
  // Nothing to prefetch and nothing resharded: the options change nothing.
  EXPECT_DOUBLE_EQ(step(w, 2, sharding(0, false)).step_ms, 8);
}

// Root P = 1000 (forward 1, backward 2), unit 1 P = 2000 (forward 3,
// backward 6).
ShardedWorkload two_units() { return units_of({{1000, 1, 2}, {2000, 3, 6}}); }

TEST(ShardedStep, TwoUnitsPrefetchTheNextAllGatherWhileTheRootComputes) {
  // 2 ranks. Forward: gathers 0 [0, 1] and 1 [1, 3] issued at 0; unit 0
  // [1, 2]; unit 1 waits to 3, [3, 6]. Backward: unit 1 gathered again
  // [6, 8], backward [8, 14], reduce-scatter [14, 16]; the root [14, 16],
  // its reduce-scatter [16, 17].
  const auto p = step(two_units(), 2, sharding(1, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 17);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 2);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 2);
  EXPECT_DOUBLE_EQ(p.tail_ms, 1);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 5);
  EXPECT_EQ(p.allgather.count, 3);
  EXPECT_DOUBLE_EQ(p.allgather.ms, 5);
  EXPECT_DOUBLE_EQ(p.reduce_scatter.ms, 3);
  EXPECT_DOUBLE_EQ(p.comm_ms, 8);
}

TEST(ShardedStep, TwoUnitsWithoutPrefetchWaitForEachGatherInFull) {
  // Unit 1's gather is issued only when it is about to run: [2, 4].
  const auto p = step(two_units(), 2, sharding(0, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 18);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 3);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 6);
}

TEST(ShardedStep, TwoUnitsWithoutReshardingGatherNothingInBackward) {
  // Forward as with prefetch, to 6; backward [6, 12] and [12, 14]; the
  // reduce-scatters [12, 14] and [14, 15].
  const auto p = step(two_units(), 2, sharding(1, false));
  EXPECT_DOUBLE_EQ(p.step_ms, 15);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 0);
  EXPECT_EQ(p.allgather.count, 2);
}

TEST(ShardedStep, TwoUnitsAtFourRanks) {
  // Collectives take 1.5x as long: gathers [0, 1.5] and [1.5, 4.5], unit 0
  // [1.5, 2.5], unit 1 [4.5, 7.5]; gathered again [7.5, 10.5], backward
  // [10.5, 16.5], reduce-scatter [16.5, 19.5]; the root [16.5, 18.5], its
  // reduce-scatter queued behind, [19.5, 21].
  const auto p = step(two_units(), 4, sharding(1, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 21);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 3.5);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 3);
  EXPECT_DOUBLE_EQ(p.tail_ms, 2.5);
}

// Root P = 1000 (forward 1, backward 2), P = 1999 padded to 2000 at 2
// ranks (forward 2, backward 4), P = 3000 (forward 3, backward 6).
ShardedWorkload three_units() { return units_of({{1000, 1, 2}, {1999, 2, 4}, {3000, 3, 6}}); }

TEST(ShardedStep, ThreeUnitsPrefetchOneAheadInBothDirections) {
  // Forward: gathers 0 [0, 1], 1 [1, 3] at 0; unit 0 [1, 2]; gather 2
  // issued at 2 runs [3, 6]; unit 1 [3, 5]; unit 2 waits to 6, [6, 9].
  // Backward: gathers 2 [9, 12] and 1 [12, 14] issued at 9; unit 2
  // [12, 18], reduce-scatter [18, 21]; unit 1 (gathered by 14) [18, 22],
  // reduce-scatter [22, 24]; root [22, 24], reduce-scatter [24, 25].
  const auto p = step(three_units(), 2, sharding(1, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 25);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 3);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 3);
  EXPECT_DOUBLE_EQ(p.tail_ms, 1);
  // Issue order on the one stream.
  std::vector<std::string> order;
  for (const auto& c : p.collectives) order.push_back(fmt::format("{} {}{}", to_string(c.kind), c.unit, c.backward ? "'" : ""));
  EXPECT_EQ(order, (std::vector<std::string>{"allgather 0", "allgather 1", "allgather 2", "allgather 2'",
                                              "allgather 1'", "reduce_scatter 2'", "reduce_scatter 1'",
                                              "reduce_scatter 0'"}));
  EXPECT_EQ(p.allgather.count, 5);
  EXPECT_DOUBLE_EQ(p.allgather.bytes, (1000 + 2000 + 3000 + 3000 + 2000) * 4);
  EXPECT_DOUBLE_EQ(p.allgather.bus_bytes, p.allgather.bytes / 2);
  EXPECT_DOUBLE_EQ(p.allgather.ms, 11);
  EXPECT_EQ(p.reduce_scatter.count, 3);
  EXPECT_DOUBLE_EQ(p.reduce_scatter.bytes, (1000 + 2000 + 3000) * 4);
  EXPECT_DOUBLE_EQ(p.reduce_scatter.ms, 6);
}

TEST(ShardedStep, WithoutPrefetchABackwardGatherQueuesBehindAReduceScatter) {
  // Forward: each gather when its unit is due: [0, 1], [2, 4], [6, 9];
  // forward ends at 12. Backward: gather 2 [12, 15], unit 2 [15, 21],
  // reduce-scatter 2 [21, 24]; gather 1 is issued at 21 but the stream is
  // busy: [24, 26]; unit 1 [26, 30], reduce-scatter [30, 32]; root [30,
  // 32], reduce-scatter [32, 33].
  const auto p = step(three_units(), 2, sharding(0, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 33);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 6);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 8);
  EXPECT_DOUBLE_EQ(p.tail_ms, 1);
  const auto& gather_again = p.collectives[5];  // after gathers 0, 1, 2, 2' and reduce-scatter 2
  EXPECT_EQ(gather_again.kind, ShardedCollective::allgather);
  EXPECT_EQ(gather_again.unit, 1);
  EXPECT_DOUBLE_EQ(gather_again.issued_ms, 21);
  EXPECT_DOUBLE_EQ(gather_again.start_ms, 24);
}

TEST(ShardedStep, ThreeUnitsWithoutReshardingOnlyReduceInBackward) {
  // Forward as with prefetch, to 9; backward [9, 15], [15, 19], [19, 21];
  // reduce-scatters [15, 18], [19, 21], [21, 22].
  const auto p = step(three_units(), 2, sharding(1, false));
  EXPECT_DOUBLE_EQ(p.step_ms, 22);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 4);
  EXPECT_EQ(p.allgather.count, 3);
}

TEST(ShardedStep, ThreeUnitsAtFourRanks) {
  // Collectives 1.5x: gathers [0, 1.5], [1.5, 4.5], [4.5, 9]; units
  // [1.5, 2.5], [4.5, 6.5], [9, 12]. Backward: gathers [12, 16.5],
  // [16.5, 19.5]; unit 2 [16.5, 22.5], reduce-scatter [22.5, 27]; unit 1
  // [22.5, 26.5], reduce-scatter [27, 30]; root [26.5, 28.5],
  // reduce-scatter [30, 31.5].
  const auto p = step(three_units(), 4, sharding(1, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 31.5);
  EXPECT_DOUBLE_EQ(p.forward_wait_ms, 6);
  EXPECT_DOUBLE_EQ(p.backward_wait_ms, 4.5);
  EXPECT_DOUBLE_EQ(p.tail_ms, 3);
}

TEST(ShardedStep, MorePrefetchHidesMoreOfTheForwardGathers) {
  // Two ahead: gather 2 is issued at 0 as well and runs [3, 6]; the same
  // here, since the stream is the limit, not the issue.
  EXPECT_DOUBLE_EQ(step(three_units(), 2, sharding(2, true)).forward_wait_ms, 3);
  // Compute long enough to hide them: each unit's forward 10 ms.
  const ShardedWorkload slow = units_of({{1000, 10, 2}, {1999, 10, 4}, {3000, 10, 6}});
  EXPECT_DOUBLE_EQ(step(slow, 2, sharding(1, true)).forward_wait_ms, 1);   // only the first
  EXPECT_DOUBLE_EQ(step(slow, 2, sharding(0, true)).forward_wait_ms, 6);   // every one
}

TEST(ShardedStep, SixteenBitParametersAndGradientsHalveTheirCollectives) {
  ShardingOptions o = sharding(1, true);
  o.param_bytes = 2;
  const auto p = step(three_units(), 2, o);
  EXPECT_DOUBLE_EQ(p.allgather.bytes, (1000 + 2000 + 3000 + 3000 + 2000) * 2);
  EXPECT_DOUBLE_EQ(p.allgather.ms, 5.5);
  EXPECT_DOUBLE_EQ(p.reduce_scatter.ms, 6);
  o.reduce_bytes = 2;
  EXPECT_DOUBLE_EQ(step(three_units(), 2, o).reduce_scatter.ms, 3);
}

TEST(ShardedStep, AUnitWithoutParametersCommunicatesNothing) {
  const auto p = step(units_of({{0, 1, 1}, {1000, 2, 4}}), 2, sharding(1, true));
  EXPECT_EQ(p.allgather.count, 2);  // unit 1 before forward and before backward
  EXPECT_EQ(p.reduce_scatter.count, 1);
}

TEST(ShardedStep, OneRankComputesOnly) {
  const auto p = step(three_units(), 1, sharding(1, true));
  EXPECT_DOUBLE_EQ(p.step_ms, 18);
  EXPECT_DOUBLE_EQ(p.exposed_ms, 0);
  EXPECT_DOUBLE_EQ(p.allgather.bus_bytes, 0);
}

TEST(ShardedStep, PredictionAddsDataRestStragglersAndThroughput) {
  ShardedWorkload w = two_units();
  w.other_ms = 3;
  w.data_ms = 2;
  w.batch = 10;
  Scenario s = half_microsecond_ring();
  const auto q = predict_sharded(w, s, sharding(1, true), 2);
  EXPECT_DOUBLE_EQ(q.step.step_ms, 17 + 3 + 2);
  EXPECT_DOUBLE_EQ(q.step.compute_ms, 12 + 3);
  EXPECT_DOUBLE_EQ(q.efficiency, (15.0 + 2) / 22);
  EXPECT_DOUBLE_EQ(q.samples_per_s, 20 * 1000 / 22.0);
  s.jitter = 0.1;
  EXPECT_DOUBLE_EQ(predict_sharded(w, s, sharding(1, true), 2).step.straggler_ms, straggler_ms(15, 0.1, 2));
}

TEST(ShardedStep, WithoutASpareCoreTheCollectivesCopyingAddsToCompute) {
  ShardedWorkload w = two_units();
  w.other_ms = 3;
  Scenario s = half_microsecond_ring();
  const auto spare = predict_sharded(w, s, sharding(1, true), 2).step;
  EXPECT_DOUBLE_EQ(spare.sharing_ms, 0);
  s.cluster.cores_per_rank = 1;  // the group's thread copies on the compute thread's core
  s.cluster.comm_cpu_share = 1;
  const auto shared = predict_sharded(w, s, sharding(1, true), 2).step;
  EXPECT_DOUBLE_EQ(shared.step_ms, shared.compute_ms + shared.comm_ms);
  EXPECT_DOUBLE_EQ(shared.sharing_ms, shared.step_ms - spare.step_ms);
  s.cluster.comm_cpu_share = 0.5;  // half a core: half of it
  EXPECT_DOUBLE_EQ(predict_sharded(w, s, sharding(1, true), 2).step.step_ms,
                   std::max(spare.step_ms, shared.compute_ms + 0.5 * shared.comm_ms));
  EXPECT_DOUBLE_EQ(predict_sharded(w, s, sharding(1, true), 1).step.sharing_ms, 0);  // a world of one copies nothing
}

// Two cores for a host of four ranks: at 4 ranks two share each core and
// take turns (the traced units' compute is each rank's own), so the step is
// twice a rank's compute and copying; at 2 ranks each has its core.
TEST(ShardedStep, RanksBeyondTheHostsCoresTakeTurnsOnThem) {
  ShardedWorkload w = two_units();
  w.other_ms = 3;
  Scenario s = half_microsecond_ring();
  s.cluster.ranks_per_host = 4;
  s.cluster.cores_per_rank = 1;
  s.cluster.comm_cpu_share = 1;
  const auto calibrated_alone = predict_sharded(w, s, sharding(1, true), 4).step;
  s.cluster.cores_per_host = 2;
  EXPECT_DOUBLE_EQ(cores_per_rank_at(s.cluster, 4), 0.5);
  EXPECT_DOUBLE_EQ(cores_per_rank_at(s.cluster, 2), 1);
  EXPECT_DOUBLE_EQ(cores_per_rank_at(s.cluster, 8), 0.5);  // four a host
  const auto four = predict_sharded(w, s, sharding(1, true), 4).step;
  EXPECT_DOUBLE_EQ(four.step_ms, 2 * (four.compute_ms + four.comm_ms));
  EXPECT_DOUBLE_EQ(calibrated_alone.step_ms, calibrated_alone.compute_ms + calibrated_alone.comm_ms);
  const auto two = predict_sharded(w, s, sharding(1, true), 2).step;
  EXPECT_DOUBLE_EQ(two.step_ms, two.compute_ms + two.comm_ms);  // a core each: no turns
  // Three on two cores: one core runs two of them, and every step waits for it.
  EXPECT_DOUBLE_EQ(turns_on_a_core(s.cluster, 3), 2);
  const auto three = predict_sharded(w, s, sharding(1, true), 3).step;
  EXPECT_DOUBLE_EQ(three.step_ms, 2 * (three.compute_ms + three.comm_ms));
  w.compute_shares_cores = true;  // units made from a --compute-trace of the ranks: turns already in it
  EXPECT_DOUBLE_EQ(predict_sharded(w, s, sharding(1, true), 4).step.step_ms, calibrated_alone.step_ms);
  w.compute_shares_cores = false;
  s.cluster.cores_per_host = 8;  // two cores a rank at 4: a spare one
  EXPECT_DOUBLE_EQ(predict_sharded(w, s, sharding(1, true), 4).step.sharing_ms, 0);
}

// A collective beside compute on a rank without a spare core runs at its
// beside-compute rate, three times the idle one here: the prefetched
// gathers and every reduce-scatter but the last unit's. A unit's own
// gather (the compute waits for it) and the last reduce-scatter (backward
// has ended) run alone. The core is charged the collectives' share of the
// time they run, beside compute their longer time. On shm, whose waits
// spin: the links below give the hand-computed durations of the ring above
// (the shm all-gather copies the whole buffer, the reduce-scatter half).
TEST(ShardedStep, BesideComputeTheCollectivesTakeTheirBusyRate) {
  ShardedWorkload w = two_units();
  Scenario s = half_microsecond_ring();
  s.cluster.algorithm = Algorithm::shm;
  s.cluster.allgather = {true, Link{0, 0.25}, 0};
  s.cluster.reduce_scatter = {true, Link{0, 0.5}, 0};
  s.cluster.allgather_beside_compute = {true, Link{0, 0.75}, 0};
  s.cluster.reduce_scatter_beside_compute = {true, Link{0, 1.5}, 0};
  const auto spare = predict_sharded(w, s, sharding(1, true), 2).step;  // no cores known: a spare one
  EXPECT_DOUBLE_EQ(spare.comm_ms, 1 + 2 + 2 + 2 + 1);
  s.cluster.cores_per_rank = 1;
  s.cluster.comm_cpu_share = 0.5;
  const auto shared = predict_sharded(w, s, sharding(1, true), 2).step;
  // Gathers 0 and 1 in forward, 1 again in backward, reduce-scatters 1 and 0.
  ASSERT_EQ(shared.collectives.size(), 5u);
  std::vector<bool> beside;
  std::vector<double> took;
  for (const auto& c : shared.collectives) {
    beside.push_back(c.beside_compute);
    took.push_back(c.end_ms - c.start_ms);
  }
  EXPECT_EQ(beside, (std::vector<bool>{false, true, false, true, false}));
  EXPECT_EQ(took, (std::vector<double>{1, 6, 2, 6, 1}));
  // Forward: gather 0 [0, 1]; gather 1, issued at 0, [1, 7]; unit 0 [1, 2],
  // waits to 7, unit 1 [7, 10]. Backward: gather 1 [10, 12], unit 1 [12, 18],
  // its reduce-scatter [18, 24]; unit 0 [18, 20], its reduce-scatter after
  // the last backward, alone: [24, 25].
  EXPECT_DOUBLE_EQ(shared.forward_wait_ms, 1 + 5);
  EXPECT_DOUBLE_EQ(shared.backward_wait_ms, 2);
  EXPECT_DOUBLE_EQ(shared.tail_ms, 25 - 20);
  EXPECT_DOUBLE_EQ(shared.comm_ms, 16);
  EXPECT_DOUBLE_EQ(shared.step_ms, 25);
  EXPECT_DOUBLE_EQ(shared.sharing_ms, 0);  // the core's bound: 12 + 0.5 x 16 = 20
  // A whole core's share: the bound, 12 + 16, is the step.
  s.cluster.comm_cpu_share = 1;
  const auto spinning = predict_sharded(w, s, sharding(1, true), 2).step;
  EXPECT_DOUBLE_EQ(spinning.step_ms, 28);
  EXPECT_DOUBLE_EQ(spinning.sharing_ms, 3);
  // tcp's waits block in the kernel and leave the core to compute: the idle
  // rates there.
  Scenario tcp = s;
  tcp.cluster.algorithm = Algorithm::tcp;
  EXPECT_FALSE(beside_compute_applies(tcp.cluster, 2));
  Scenario tcp_idle = tcp;
  tcp_idle.cluster.allgather_beside_compute = tcp_idle.cluster.reduce_scatter_beside_compute = {};
  EXPECT_DOUBLE_EQ(predict_sharded(w, tcp, sharding(1, true), 2).step.step_ms,
                   predict_sharded(w, tcp_idle, sharding(1, true), 2).step.step_ms);
  // Four ranks on two cores take turns, which charge the competition for
  // the core: the idle rates, as without the busy rows.
  s.cluster.ranks_per_host = 4;
  s.cluster.cores_per_host = 2;
  const auto turns = predict_sharded(w, s, sharding(1, true), 4).step;
  Scenario idle = s;
  idle.cluster.allgather_beside_compute = idle.cluster.reduce_scatter_beside_compute = {};
  EXPECT_DOUBLE_EQ(turns.step_ms, predict_sharded(w, idle, sharding(1, true), 4).step.step_ms);
  EXPECT_DOUBLE_EQ(turns.comm_ms, predict_sharded(w, idle, sharding(1, true), 4).step.comm_ms);
}

TEST(ShardedStep, OptionsOutOfRangeAreRefused) {
  EXPECT_THROW(step(units_of({}), 2, sharding(1, true)), InvalidArgument);
  EXPECT_THROW(step(two_units(), 2, sharding(-1, true)), InvalidArgument);
  EXPECT_THROW(step(two_units(), 0, sharding(1, true)), InvalidArgument);
}

// --- communication against DDP ----------------------------------------------

// With resharding every unit is gathered twice and reduced once: 3 x
// (n-1)/n of the parameters against the ring all-reduce's 2 x (n-1)/n, so
// 1.5x DDP's; without, 2 x (n-1)/n, the same as DDP. A root with
// parameters is gathered once, so it takes (3P - P_root) / 2P.
TEST(ShardedStep, MovesOneAndAHalfTimesDdpsAllReduceWithReshardingAndAsMuchWithout) {
  for (int n : {2, 4, 8}) {
    const ShardedWorkload w = units_of({{0, 1, 1}, {8000, 1, 1}, {1600, 1, 1}, {4096, 1, 1}});
    const auto moved = [&](bool reshard) {
      const auto q = predict_sharded(w, half_microsecond_ring(), sharding(1, reshard), n);
      return (q.step.allgather.bus_bytes + q.step.reduce_scatter.bus_bytes) / q.ddp_bus_bytes;
    };
    EXPECT_DOUBLE_EQ(moved(true), 1.5) << n;
    EXPECT_DOUBLE_EQ(moved(false), 1.0) << n;
    const ShardedWorkload rooted = units_of({{4000, 1, 1}, {8000, 1, 1}});
    const auto q = predict_sharded(rooted, half_microsecond_ring(), sharding(1, true), n);
    EXPECT_DOUBLE_EQ((q.step.allgather.bus_bytes + q.step.reduce_scatter.bus_bytes) / q.ddp_bus_bytes,
                     (3 * 12000.0 - 4000) / (2 * 12000))
        << n;
  }
}

// --- memory -----------------------------------------------------------------

TEST(ShardedMemory, OneUnitHoldsItsShardsAndTheWholeUnitOnce) {
  // 2 ranks: 500 elements x (4 + 4 + 8) bytes of shards, the root's 1000
  // parameters and 1000 gradients of 4 bytes. DDP: 1000 x 16, and the
  // second set of buckets 1000 x 4.
  const ShardedMemory m = sharded_memory(units_of({{1000, 2, 4}}), 2, sharding(1, true));
  EXPECT_DOUBLE_EQ(m.sharded_bytes, 8000);
  EXPECT_DOUBLE_EQ(m.gathered_bytes, 4000);
  EXPECT_DOUBLE_EQ(m.unsharded_gradient_bytes, 4000);
  EXPECT_DOUBLE_EQ(m.total_bytes, 16000);
  EXPECT_DOUBLE_EQ(m.ddp_bytes, 20000);
  EXPECT_DOUBLE_EQ(sharded_memory(units_of({{1000, 2, 4}}), 2, sharding(1, true), /*ddp_bucket_view=*/true).ddp_bytes,
                   16000);
  // 4 ranks: 250 elements of shards each.
  EXPECT_DOUBLE_EQ(sharded_memory(units_of({{1000, 2, 4}}), 4, sharding(1, true)).total_bytes, 4000 + 4000 + 4000);
}

TEST(ShardedMemory, TwoUnitsKeepTheRootAndTheUnitComputing) {
  // 2 ranks: 1500 elements of shards x 16; gathered the root (1000) and
  // unit 1 (2000) x 4; unit 1's gradients 2000 x 4.
  const ShardedMemory m = sharded_memory(two_units(), 2, sharding(1, true));
  EXPECT_DOUBLE_EQ(m.sharded_bytes, 24000);
  EXPECT_DOUBLE_EQ(m.gathered_bytes, 12000);
  EXPECT_DOUBLE_EQ(m.unsharded_gradient_bytes, 8000);
  EXPECT_DOUBLE_EQ(m.total_bytes, 44000);
  EXPECT_DOUBLE_EQ(m.ddp_bytes, 3000 * 20);
  // 4 ranks: 750 elements of shards.
  EXPECT_DOUBLE_EQ(sharded_memory(two_units(), 4, sharding(1, true)).total_bytes, 12000 + 12000 + 8000);
}

TEST(ShardedMemory, ThreeUnitsAddThePrefetchedUnitAndWithoutReshardingEveryUnit) {
  // 2 ranks: shards 500 + 1000 + 1500 (P = 1999 padded to 2000) x 16.
  // Gathered: the root (1000), the unit computing and the one prefetched
  // taken as the two largest (3000, 2000); gradients of the largest.
  const ShardedMemory m = sharded_memory(three_units(), 2, sharding(1, true));
  EXPECT_DOUBLE_EQ(m.sharded_bytes, 48000);
  EXPECT_DOUBLE_EQ(m.gathered_bytes, 6000 * 4);
  EXPECT_DOUBLE_EQ(m.unsharded_gradient_bytes, 3000 * 4);
  EXPECT_DOUBLE_EQ(m.total_bytes, 84000);
  EXPECT_DOUBLE_EQ(m.ddp_bytes, 5999 * 20);
  // Without prefetch: the root and the largest.
  EXPECT_DOUBLE_EQ(sharded_memory(three_units(), 2, sharding(0, true)).gathered_bytes, 4000 * 4);
  // 4 ranks, P = 1999 padded to 2000 (500 each): shards 250 + 500 + 750.
  EXPECT_DOUBLE_EQ(sharded_memory(three_units(), 4, sharding(0, true)).sharded_bytes, 1500 * 16);
  // Without resharding every unit stays gathered from forward to backward.
  const ShardedWorkload four = units_of({{1000, 1, 1}, {1000, 1, 1}, {1000, 1, 1}, {1000, 1, 1}});
  EXPECT_DOUBLE_EQ(sharded_memory(four, 2, sharding(0, false)).gathered_bytes, 4000 * 4);
  EXPECT_DOUBLE_EQ(sharded_memory(four, 2, sharding(0, true)).gathered_bytes, 2000 * 4);
  // bf16 parameters: half the gathered bytes.
  ShardingOptions half = sharding(0, true);
  half.param_bytes = 2;
  EXPECT_DOUBLE_EQ(sharded_memory(four, 2, half).gathered_bytes, 2000 * 2);
}

// --- workloads --------------------------------------------------------------

TEST(ShardedWorkloads, DescribedLayersBecomeUnitsWithTheirBiases) {
  // The mlp: 6 x (weight, bias); the biases have no compute of their own.
  const Workload mlp = from_description(builtin_description("mlp"));
  const ShardedWorkload w = units_from(mlp);
  ASSERT_EQ(w.units.size(), 6u);
  for (const auto& u : w.units) {
    EXPECT_DOUBLE_EQ(u.parameters, 2048.0 * 2048 + 2048);
    EXPECT_NEAR(u.forward_ms, mlp.forward_ms / 6, 1e-9);
    EXPECT_NEAR(u.backward_ms, mlp.backward_ms / 6, 1e-9);
  }
  EXPECT_NEAR(w.forward_ms(), mlp.forward_ms, 1e-9);
  EXPECT_NEAR(w.backward_ms(), mlp.backward_ms, 1e-9);
  EXPECT_EQ(w.batch, mlp.batch);
}

TEST(ShardedWorkloads, UnitCountGroupsConsecutiveLayersByParameters) {
  const Workload mlp = from_description(builtin_description("mlp"));
  const ShardedWorkload three = units_from(mlp, 3);
  ASSERT_EQ(three.units.size(), 3u);
  for (const auto& u : three.units) EXPECT_DOUBLE_EQ(u.parameters, 2 * (2048.0 * 2048 + 2048));
  EXPECT_EQ(units_from(mlp, 1).units.size(), 1u);
  EXPECT_EQ(units_from(mlp, 100).units.size(), 6u);  // no more units than layers
  // A large layer in the middle keeps its own unit.
  Description d;
  d.layer_parameters = {10, 10, 1000, 10, 10};
  const ShardedWorkload w = units_from(from_description(d), 3);
  ASSERT_EQ(w.units.size(), 3u);
  EXPECT_DOUBLE_EQ(w.units[0].parameters, 20);
  EXPECT_DOUBLE_EQ(w.units[1].parameters, 1000);
  EXPECT_DOUBLE_EQ(w.units[2].parameters, 20);
}

TEST(ShardedWorkloads, GradientReadyTimesGiveEachLayersBackward) {
  // Backward 10 ms; gradients (backward order) ready at 3 and 7: the last
  // layer 3 ms, the first 4 ms and the 3 ms after its gradient.
  Workload w;
  w.forward_ms = 5;
  w.backward_ms = 10;
  w.gradients = {{400, 3}, {800, 7}};
  const ShardedWorkload s = units_from(w);
  ASSERT_EQ(s.units.size(), 2u);
  EXPECT_DOUBLE_EQ(s.units[0].parameters, 200);
  EXPECT_DOUBLE_EQ(s.units[0].backward_ms, 7);
  EXPECT_DOUBLE_EQ(s.units[0].forward_ms, 3.5);
  EXPECT_DOUBLE_EQ(s.units[1].parameters, 100);
  EXPECT_DOUBLE_EQ(s.units[1].backward_ms, 3);
  // And back: DDP's gradients of the same units.
  const Workload back = as_data_parallel(s);
  ASSERT_EQ(back.gradients.size(), 2u);
  EXPECT_DOUBLE_EQ(back.gradients[0].bytes, 400);
  EXPECT_DOUBLE_EQ(back.gradients[0].ready_ms, 3);
  EXPECT_DOUBLE_EQ(back.gradients[1].ready_ms, 10);
  EXPECT_DOUBLE_EQ(back.forward_ms, 5);
  EXPECT_THROW(units_from(Workload{}), InvalidArgument);
}

// Three runs' compute (backward 10, 30 and 20 ms): the interval runs from
// the fastest run's step to the slowest's, and the median run (the third)
// stands for the job.
TEST(ShardedWorkloads, SeveralProfiledRunsGiveTheStepItsIntervalAndTheMedianRun) {
  std::vector<ShardedWorkload> runs;
  for (double backward : {10.0, 30.0, 20.0}) {
    Workload w;
    w.forward_ms = 5;
    w.backward_ms = backward;
    w.gradients = {{4e6, backward / 2}, {4e6, backward}};
    runs.push_back(units_from(w));
  }
  const Scenario s = half_microsecond_ring();
  const ShardingOptions o;
  const StepInterval interval = sharded_step_interval(runs, s, o, 4);
  EXPECT_EQ(interval.typical, 2u);
  EXPECT_DOUBLE_EQ(interval.low_ms, predict_sharded(runs[0], s, o, 4).step.step_ms);
  EXPECT_DOUBLE_EQ(interval.high_ms, predict_sharded(runs[1], s, o, 4).step.step_ms);
  EXPECT_LT(interval.low_ms, predict_sharded(runs[2], s, o, 4).step.step_ms);
  EXPECT_LT(predict_sharded(runs[2], s, o, 4).step.step_ms, interval.high_ms);
  const StepInterval one = sharded_step_interval({runs[0]}, s, o, 4);
  EXPECT_EQ(one.low_ms, one.high_ms);
  EXPECT_THROW(sharded_step_interval({}, s, o, 4), InvalidArgument);
}

class ShardedTraceFiles : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("sharded-trace-{}", ::getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// Three steps of two units (the root of 1000 parameters, unit 1 of 3000);
// the first is slow and skipped; unit 1's backward is 6 ms, then 8 ms.
std::string sharded_trace_text() {
  std::string events;
  const auto ev = [&](const std::string& name, const char* cat, double ts, double dur, int pid) {
    events += fmt::format("{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{},\"tid\":0}},",
                          name, cat, ts, dur, pid);
  };
  for (int step = 0; step < 3; ++step) {
    const double t = step * 100000;
    const double slow = step == 0 ? 5 : 1;
    ev("forward", "step", t, 20000, 0);
    ev("unit 0 forward (1000 parameters)", "units", t + 1000, 1000 * slow, 0);
    ev("unit 1 forward (3000 parameters)", "units", t + 5000, 3000 * slow, 0);
    ev("unit 1 backward (3000 parameters)", "units", t + 20000, (step == 2 ? 8000 : 6000) * slow, 0);
    ev("unit 0 backward (1000 parameters)", "units", t + 30000, 2000 * slow, 0);
    ev("between steps (optimizer, data, ...)", "step", t + 40000, 4000, 0);
    ev("unit 0 forward (1000 parameters)", "units", t, 99000, 1);  // another rank
  }
  events += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0}";
  return "{\"traceEvents\":[" + events + "]}";
}

TEST_F(ShardedTraceFiles, TraceGivesEachUnitsComputeAndParameters) {
  const ShardedWorkload w = sharded_from_trace(write("f.rank0.json", sharded_trace_text()), 0, /*skip=*/1);
  ASSERT_EQ(w.units.size(), 2u);
  EXPECT_DOUBLE_EQ(w.units[0].parameters, 1000);
  EXPECT_DOUBLE_EQ(w.units[0].forward_ms, 1);
  EXPECT_DOUBLE_EQ(w.units[0].backward_ms, 2);
  EXPECT_DOUBLE_EQ(w.units[1].parameters, 3000);
  EXPECT_DOUBLE_EQ(w.units[1].forward_ms, 3);
  EXPECT_DOUBLE_EQ(w.units[1].backward_ms, 7);  // the median of 6 and 8
  EXPECT_DOUBLE_EQ(w.other_ms, 4);
}

TEST_F(ShardedTraceFiles, TraceWithoutUnitsSaysHowToGetOne) {
  const std::string path = write("empty.rank0.json", "{\"traceEvents\":[]}");
  try {
    sharded_from_trace(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_TRACE"), std::string::npos) << e.what();
  }
}

// --- calibration ------------------------------------------------------------

std::vector<cli::BenchRow> rows_of(const std::string& op, const Link& l, double gamma) {
  std::vector<cli::BenchRow> rows;
  for (double s = 1 << 20; s <= 64 << 20; s *= 2) {
    const CostTerms t = op == "allgather"        ? allgather_terms(Algorithm::tcp, 2, s)
                        : op == "reduce_scatter" ? reduce_scatter_terms(Algorithm::tcp, 2, s)
                                                 : flat_terms(Algorithm::tcp, 2, s);
    rows.push_back({2, "tcp", op, s, cost_us(t, l, gamma, s)});
  }
  return rows;
}

TEST(ShardedCalibration, AllGatherAndReduceScatterRowsCalibrateTheirOwnLinks) {
  std::vector<cli::BenchRow> rows = rows_of("allreduce", Link::from_bandwidth(50, 1), 0);
  const auto gather = rows_of("allgather", Link::from_bandwidth(30, 2), 0);
  const auto scatter = rows_of("reduce_scatter", Link::from_bandwidth(40, 0.5), 0);
  rows.insert(rows.end(), gather.begin(), gather.end());
  rows.insert(rows.end(), scatter.begin(), scatter.end());
  const Calibration c = calibrate_cluster(rows, "", -1, 1);
  EXPECT_NEAR(c.cluster.intra.gb_per_s(), 1, 1e-6);  // the links: the all-reduce only
  ASSERT_TRUE(c.cluster.allgather.calibrated);
  EXPECT_NEAR(c.cluster.allgather.link.gb_per_s(), 2, 1e-6);
  EXPECT_NEAR(c.cluster.allgather.link.alpha_us, 30, 1e-3);
  ASSERT_TRUE(c.cluster.reduce_scatter.calibrated);
  EXPECT_NEAR(c.cluster.reduce_scatter.link.gb_per_s(), 0.5, 1e-6);
  // Through cluster.json and back.
  const Cluster back = parse_cluster_json(cluster_json(c.cluster));
  EXPECT_TRUE(back.allgather.calibrated);
  EXPECT_NEAR(back.allgather.link.gb_per_s(), 2, 1e-6);
  EXPECT_NEAR(back.reduce_scatter.link.alpha_us, 40, 1e-3);
}

TEST(ShardedCalibration, WithoutTheirRowsTheyTakeTheAllReducesLinkAndSaySo) {
  const Calibration c = calibrate_cluster(rows_of("allreduce", Link::from_bandwidth(50, 1), 0), "", -1, 1);
  EXPECT_FALSE(c.cluster.allgather.calibrated);
  EXPECT_FALSE(c.cluster.reduce_scatter.calibrated);
  std::string notes;
  for (const auto& n : c.notes) notes += n + "\n";
  EXPECT_NE(notes.find("allgather: no rows (bench --op allgather --json)"), std::string::npos) << notes;
  EXPECT_NE(notes.find("reduce_scatter: no rows"), std::string::npos) << notes;
  EXPECT_FALSE(parse_cluster_json(cluster_json(c.cluster)).allgather.calibrated);
}

// Rows of `bench --busy N` calibrate the two collectives beside compute
// and nothing else: the links, the share of a core and the idle
// collectives come from the idle rows.
TEST(ShardedCalibration, BusyRowsCalibrateTheCollectivesBesideComputeOnly) {
  std::vector<cli::BenchRow> rows = rows_of("allreduce", Link::from_bandwidth(50, 1), 0);
  for (const auto& [op, gbps, busy] : {std::tuple{"allgather", 2.0, 0}, std::tuple{"reduce_scatter", 0.5, 0},
                                       std::tuple{"allgather", 0.8, 2}, std::tuple{"reduce_scatter", 0.25, 2},
                                       std::tuple{"allreduce", 0.1, 2}}) {
    for (auto r : rows_of(op, Link::from_bandwidth(30, gbps), 0)) {
      r.busy = busy;
      rows.push_back(r);
    }
  }
  const Calibration c = calibrate_cluster(rows, "", -1, 1);
  EXPECT_NEAR(c.cluster.intra.gb_per_s(), 1, 1e-6);  // the busy all-reduce rows left out
  EXPECT_NEAR(c.cluster.allgather.link.gb_per_s(), 2, 1e-6);
  EXPECT_NEAR(c.cluster.reduce_scatter.link.gb_per_s(), 0.5, 1e-6);
  ASSERT_TRUE(c.cluster.allgather_beside_compute.calibrated);
  EXPECT_NEAR(c.cluster.allgather_beside_compute.link.gb_per_s(), 0.8, 1e-6);
  ASSERT_TRUE(c.cluster.reduce_scatter_beside_compute.calibrated);
  EXPECT_NEAR(c.cluster.reduce_scatter_beside_compute.link.gb_per_s(), 0.25, 1e-6);
  const Cluster beside = beside_compute(c.cluster);
  EXPECT_NEAR(beside.allgather.link.gb_per_s(), 0.8, 1e-6);
  EXPECT_NEAR(beside.intra.gb_per_s(), 1, 1e-6);
  const Cluster back = parse_cluster_json(cluster_json(c.cluster));
  ASSERT_TRUE(back.reduce_scatter_beside_compute.calibrated);
  EXPECT_NEAR(back.reduce_scatter_beside_compute.link.gb_per_s(), 0.25, 1e-6);
  EXPECT_NEAR(back.allgather_beside_compute.link.alpha_us, 30, 1e-3);
  // Without busy rows: the idle rates beside compute too, and a note says so.
  const Calibration idle = calibrate_cluster(rows_of("allreduce", Link::from_bandwidth(50, 1), 0), "", -1, 1);
  EXPECT_FALSE(idle.cluster.allgather_beside_compute.calibrated);
  std::string notes;
  for (const auto& n : idle.notes) notes += n + "\n";
  EXPECT_NE(notes.find("beside compute: no rows (bench --op allgather --busy N --json)"), std::string::npos) << notes;
  // Busy rows alone cannot set the links.
  std::vector<cli::BenchRow> only_busy = rows_of("allreduce", Link::from_bandwidth(50, 1), 0);
  for (auto& r : only_busy) r.busy = 1;
  EXPECT_THROW(calibrate_cluster(only_busy, "", -1, 1), InvalidArgument);
}

TEST(ShardedCalibration, FitCollectiveRefusesAnOpWithoutACostModel) {
  EXPECT_THROW(fit_collective({}, "broadcast", Algorithm::ring), InvalidArgument);
}

// --- the report -------------------------------------------------------------

TEST(ShardedReport, AlternativesChangeOneOptionAndTheReportNamesTheFasterOnes) {
  ShardedWorkload w = three_units();
  const Scenario s = half_microsecond_ring();
  const auto alternatives = cli::sharding_alternatives(w, s, sharding(0, true), 2);
  ASSERT_EQ(alternatives.size(), 4u);
  EXPECT_EQ(alternatives[0].change, "--prefetch 1");
  EXPECT_DOUBLE_EQ(alternatives[0].step_ms, 25);
  EXPECT_EQ(alternatives[1].change, "--no-reshard-after-forward (ZeRO-2)");
  const std::vector<cli::ShardedComparison> runs{{predict_sharded(w, s, sharding(0, true), 2), {}}};
  const std::string report = cli::render_sharded(w, s, sharding(0, true), runs, alternatives);
  EXPECT_NE(report.find("| 2 | 1 | 33.0 |"), std::string::npos) << report;
  EXPECT_NE(report.find("- --prefetch 1: 25.0 ms per step instead of 33.0 ms"), std::string::npos) << report;
  const auto json = cli::sharded_json(w, sharding(0, true), runs, alternatives);
  EXPECT_DOUBLE_EQ(json["predictions"][0]["step_ms"].template get<double>(), 33);
  EXPECT_EQ(json["predictions"][0]["allgather"]["count"].template get<int>(), 5);
  EXPECT_EQ(json["units"].size(), 3u);
}

}  // namespace
}  // namespace lockstep::sim
