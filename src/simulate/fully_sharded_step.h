// One fully sharded step (fully_shard, FSDP2's model; ZeRO-3), simulated:
// every rank holds 1/N of each unit's flat parameters (padded to a
// multiple of N); each unit's parameters are all-gathered before its
// forward (the next units' prefetched while it computes), freed after it
// unless the unit is the root or resharding is off (ZeRO-2), gathered
// again before its backward (the units before it prefetched), and its
// gradients are reduce-scattered after its backward. All collectives run
// in the order they are issued on one communication stream, so a
// prefetched all-gather queues behind the reduce-scatters issued before
// it. Also the memory a rank holds at the peak, against DDP's on the same
// model. Pure functions; thread-safe.
#pragma once

#include <functional>
#include <vector>

#include "simulate/fully_sharded_workload.h"
#include "simulate/step_simulation.h"

namespace lockstep::sim {

struct ShardingOptions {
  // All-gathers issued ahead of the unit about to compute: before unit k's
  // forward those of units k+1 .. k+prefetch, before its backward those of
  // the `prefetch` units that run backward next. 0: each unit's all-gather
  // is issued when the unit is about to compute.
  int prefetch = 1;
  // Free a unit's gathered parameters after its forward and gather them
  // again for its backward (ZeRO-3); off: kept from forward to backward
  // (ZeRO-2), no all-gather in backward. The root is never resharded
  // after forward.
  bool reshard_after_forward = true;
  double param_bytes = 4;      // the all-gathered element: 4 (fp32) or 2 (bf16 parameters)
  double reduce_bytes = 4;     // the reduce-scattered element: 4 (fp32) or 2 (bf16 gradients)
  double optimizer_bytes = 8;  // optimizer state per parameter element (Adam's two moments in fp32: 8)
};

enum class ShardedCollective { allgather, reduce_scatter };
const char* to_string(ShardedCollective c);

struct ShardedCollectiveTiming {
  ShardedCollective kind = ShardedCollective::allgather;
  int unit = 0;
  bool backward = false;  // issued during backward
  double bytes = 0;       // the whole buffer: the all-gather's output, the reduce-scatter's input
  double issued_ms = 0;   // after forward starts
  double start_ms = 0;
  double end_ms = 0;
  // Issued while the rank has compute left to overlap it: every prefetched
  // gather, every reduce-scatter but the one after the last backward.
  bool beside_compute = false;
};

// One collective kind's share of the step.
struct CollectiveTotals {
  int count = 0;
  double bytes = 0;      // whole buffers
  double bus_bytes = 0;  // what a rank moves (allgather_bus_bytes, reduce_scatter_bus_bytes)
  double ms = 0;
};

struct ShardedStepPrediction {
  double step_ms = 0;
  double compute_ms = 0;  // forward + backward + the rest
  double comm_ms = 0;     // sum of the collectives' durations
  double exposed_ms = 0;  // compute waiting for collectives: the three below
  double forward_wait_ms = 0;   // forward waiting for all-gathers
  double backward_wait_ms = 0;  // backward waiting for all-gathers
  double tail_ms = 0;           // after backward, waiting for the last reduce-scatters
  double straggler_ms = 0;
  // Compute slowed by the collectives' copying on its core, where a rank
  // has no spare core (Cluster::cores_per_rank below 2): the step is then
  // at least the compute plus the collectives' share of a core.
  double sharing_ms = 0;
  double data_ms = 0;
  CollectiveTotals allgather;
  CollectiveTotals reduce_scatter;
  std::vector<ShardedCollectiveTiming> collectives;  // in issue order
};

// How long one collective of a whole buffer of `bytes` takes: alone on the
// group, and beside the rank's compute (on a rank without a spare core the
// two compete for it); an empty beside-compute function takes the alone one.
struct ShardedCollectiveTimes {
  std::function<double(double bytes)> allgather_ms;
  std::function<double(double bytes)> reduce_scatter_ms;
  std::function<double(double bytes)> allgather_beside_compute_ms;
  std::function<double(double bytes)> reduce_scatter_beside_compute_ms;
};

// A unit without parameters communicates nothing. Throws InvalidArgument
// for a workload without units or options out of range.
ShardedStepPrediction simulate_sharded_step(const ShardedWorkload& w, int ranks, const ShardingOptions& o,
                                            const ShardedCollectiveTimes& times, double straggler_ms = 0);

// A unit's elements per rank: its parameters padded to a multiple of N, / N.
double shard_elements(double parameters, int ranks);

// What a rank holds at the peak of the step, in bytes: its shards of the
// fp32 parameters and gradients and of the optimizer state (1/N of the
// model, padded), the parameters gathered at once (param_bytes each: the
// root's, which stay gathered, and those of the unit computing and the
// units prefetched, taken as the largest; without resharding every
// unit's, gathered from forward to backward), and the largest unit's
// unsharded gradients (reduce_bytes each). DDP on the same model keeps all
// parameters, gradients and optimizer state, and its reducer a second set
// of gradient buckets (out of place; one set with gradient_as_bucket_view).
struct ShardedMemory {
  double sharded_bytes = 0;
  double gathered_bytes = 0;
  double unsharded_gradient_bytes = 0;
  double total_bytes = 0;
  double ddp_bytes = 0;
};

ShardedMemory sharded_memory(const ShardedWorkload& w, int ranks, const ShardingOptions& o,
                             bool ddp_bucket_view = false);

struct ShardedScalePrediction {
  int ranks = 1;
  int hosts = 1;
  ShardedStepPrediction step;
  ShardedMemory memory;
  double ddp_bus_bytes = 0;  // DDP's all-reduce of the same (fp32) gradients, for comparison
  double samples_per_s = 0;
  double efficiency = 1;  // weak scaling: the step of one rank computing alone over this one
};

// The scenario's cluster and compute spread; its DDP choices (buckets,
// hook, accumulation) do not apply, except bucket_view for DDP's memory.
ShardedScalePrediction predict_sharded(const ShardedWorkload& w, const Scenario& s, const ShardingOptions& o,
                                       int ranks);

// The fully sharded step's run-to-run interval over several profiles of
// one job (separate runs' compute), as step_interval gives DDP's.
StepInterval sharded_step_interval(const std::vector<ShardedWorkload>& profiles, const Scenario& s,
                                   const ShardingOptions& o, int ranks);

}  // namespace lockstep::sim
