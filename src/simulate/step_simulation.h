// An event simulation of one synchronous data-parallel step: buckets become
// ready during backward at their profiled times, their all-reduces run on
// the group one at a time in bucket order (a bucket waits for its
// predecessor), overlapping the rest of backward; whatever runs past the
// end of backward is exposed. Optional terms: the slowest rank's extra
// compute (stragglers) and data loading. Pure functions; thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "simulate/cost_model.h"
#include "simulate/workload.h"

namespace lockstep::sim {

struct BucketTiming {
  double bytes = 0;
  double ready_ms = 0;  // after backward starts
  double start_ms = 0;
  double end_ms = 0;
};

struct StepPrediction {
  double step_ms = 0;
  double compute_ms = 0;    // forward + backward + the rest, of a typical rank
  double comm_ms = 0;       // sum of the collectives' durations
  double exposed_ms = 0;    // communication after backward ended
  double straggler_ms = 0;  // the slowest rank's extra compute, which everyone waits for
  double data_ms = 0;
  std::vector<BucketTiming> buckets;
};

// `collective_ms(bytes)`: one bucket's all-reduce.
StepPrediction simulate_step(const Workload& w, const std::vector<PlannedBucket>& buckets,
                             const std::function<double(double bytes)>& collective_ms, double straggler_ms = 0);

// What to simulate at each world size.
struct Scenario {
  Cluster cluster;
  double bucket_cap_mb = 25;
  std::string hook = "none";  // none, fp16, bf16: 16-bit gradients halve the bytes on the wire
  int accumulation = 1;       // micro-batches per synchronised step (no_sync on the others)
  double jitter = 0;          // per-rank compute spread (standard deviation / mean)
};

struct ScalePrediction {
  int ranks = 1;
  int hosts = 1;
  StepPrediction step;       // the synchronised micro-step
  double step_ms = 0;        // per optimizer step, all micro-batches included
  double samples_per_s = 0;  // across all ranks
  double efficiency = 1;     // weak scaling: time per sample at 1 rank / at n
  double latency_share = 0;  // of the communication, the part spent in per-message latency
};

ScalePrediction predict(const Workload& w, const Scenario& s, int ranks);

// The slowest of n ranks whose compute varies with relative spread
// `jitter`: the expected maximum of n normal draws, about
// mean * jitter * sqrt(2 ln n) above the mean.
double straggler_ms(double compute_ms, double jitter, int ranks);

// The choices that minimise the predicted time per sample at `ranks`.
struct Recommendation {
  double bucket_cap_mb = 25;
  std::string hook = "none";
  double step_ms = 0;           // with the best bucket cap and hook, one micro-batch
  double default_step_ms = 0;   // with the scenario's own choices
  int accumulation_for_90 = 0;  // micro-batches for 90% efficiency; 0 if 64 are not enough
};

Recommendation recommend(const Workload& w, const Scenario& s, int ranks);

// The largest cost at the largest world size, in plain words with numbers.
std::string bottleneck(const Workload& w, const Scenario& s, const ScalePrediction& p);

}  // namespace lockstep::sim
