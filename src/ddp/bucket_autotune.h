// Bucket autotuning: the bucket cap that leaves the least communication
// exposed after backward, as the simulator's step model (src/simulate)
// predicts it from a measured gradient timeline and the group's fitted
// all-reduce cost. The pure parts (fit, choice) are separate from the
// collective that gathers their inputs, so they can be tested against
// hand-computed cases. Pure functions are thread-safe; the collective is
// driven from the thread that drives the Reducer.
#pragma once

#include <functional>
#include <vector>

#include "lockstep/reducer.h"
#include "simulate/cost_model.h"
#include "simulate/workload.h"

namespace lockstep {

// One all-reduce measured on the group: `bytes` took `us`.
struct AllreduceSample {
  double bytes = 0;
  double us = 0;
};

// The link (alpha, beta) under which sim::allreduce_us of `algorithm` on
// `world` ranks fits `samples` best (least squares on the relative error;
// the reduction's cost is folded into beta). Both terms stay >= 0.
// Throws InvalidArgument without a sample.
sim::Cluster fit_allreduce_cost(const std::vector<AllreduceSample>& samples, sim::Algorithm algorithm, int world);

struct BucketCapChoice {
  double cap_bytes = 0;
  double exposed_ms = 0;             // predicted with the chosen cap
  double configured_exposed_ms = 0;  // predicted with the configured one
  std::size_t buckets = 0;           // planned with the chosen cap
};

// The caps tried for `total_bytes` of gradients: 256 KiB to 1 GiB in
// roughly doubling steps, those below the total, and the total itself
// (one bucket after the first).
std::vector<double> candidate_caps(double total_bytes);

// `gradients`: in the order buckets are planned (the order they became
// ready), each with when it became ready after backward began;
// `collective_ms(bytes)`: one bucket's all-reduce. Another cap replaces the
// configured one only if it predicts at least 1% (and 10 us) less exposed
// communication, so that noise does not move a cap that is as good; among
// equally good caps the largest (fewest collectives) wins.
BucketCapChoice choose_bucket_cap(const std::vector<sim::Gradient>& gradients, double backward_ms,
                                  const std::function<double(double bytes)>& collective_ms, double first_bucket_bytes,
                                  double configured_cap_bytes);

// What one rank measured in its first synchronised steps.
struct GradientTimeline {
  std::vector<double> ready_ms;  // per parameter (model order), after backward began
  double backward_ms = 0;
  // Each bucket of the plan in use: its bytes and how long its all-reduce
  // took inside the step (0: not measured on this rank).
  std::vector<AllreduceSample> buckets;
};

// How much slower the steps' bucket all-reduces ran than `cost` predicts
// for the idle group (on CPUs, backward and the collectives share cores
// and memory): the ratio of the sums, at least 1; 1 without samples.
double contention_factor(const std::vector<AllreduceSample>& in_step, const sim::Cluster& cost, int world,
                         double wire_fraction);

// Collective, on every rank at the same point: times all-reduces of a few
// sizes (a short probe), takes the slowest rank's timeline and probe times
// (collectives wait for the last rank) and the fastest rank's in-step
// bucket times (the others include waiting for it), fits the cost and
// scales it by the contention the steps showed, and rank 0 decides and
// broadcasts the cap, so every rank plans the same buckets. `order`: the agreed
// planning order; `wire_fraction`: bytes on the wire per gradient byte
// (0.5 under fp16/bf16 compression).
BucketAutotune autotune_bucket_cap(ProcessGroup& pg, const std::vector<ParamSpec>& params,
                                   const std::vector<std::size_t>& order, const GradientTimeline& mine,
                                   const BucketPlanOptions& configured, double wire_fraction);

}  // namespace lockstep
