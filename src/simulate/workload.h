// What one data-parallel step does, as the simulation needs it: forward and
// backward time, the rest of the step, and each gradient's size and the time
// backward produces it. Built from a description (layer sizes, time per
// sample) or from what a real run writes (LOCKSTEP_TRACE, LOCKSTEP_STATS).
// Values and pure functions (the readers read files); thread-safe.
#pragma once

#include <string>
#include <vector>

namespace lockstep::sim {

// One gradient tensor, in the order backward produces them.
struct Gradient {
  double bytes = 0;
  double ready_ms = 0;  // after backward starts
};

struct Workload {
  std::string name;
  int batch = 0;           // samples per rank per step; 0: not known (a profile's files do not record it)
  double forward_ms = 0;
  double backward_ms = 0;
  double other_ms = 0;     // optimizer and the rest of the step
  double data_ms = 0;      // data loading
  std::vector<Gradient> gradients;
  // The compute was timed on the ranks of a host sharing its cores (a
  // --compute-trace of N ranks): their turns on the cores are in it, and
  // the model adds none (cost_model.h, turns_on_a_core).
  bool compute_shares_cores = false;
  double gradient_bytes() const;
};

// A model not yet run: parameters per layer in forward order (and,
// optionally, each layer's share of the compute; by default proportional to
// its parameters), the forward+backward time per sample, the batch.
struct Description {
  std::string name = "described";
  std::vector<double> layer_parameters;
  std::vector<double> layer_compute;  // empty: proportional to parameters
  double ms_per_sample = 1;
  int batch = 32;
  double backward_share = 2.0 / 3;  // backward costs about twice forward
  double other_ms = 0;
  double bytes_per_parameter = 4;
};

Workload from_description(const Description& d);

// The descriptions of the examples' models (models/lockstep_models/models.h: mlp,
// convnet) and of ResNet-50 (per residual block). Times per sample are
// placeholders the caller replaces with measured or quoted ones.
Description builtin_description(const std::string& model);

// Timings from a LOCKSTEP_TRACE file (one rank's, or a merged one: `rank`
// picks the process), averaged over the steps after `skip` warm-up steps.
// Gradients are the traced buckets: their sizes and when each was launched.
// Throws Error when the file has no DDP steps.
Workload from_trace(const std::string& path, int rank = 0, int skip = 2);

// The spread of compute between ranks and steps, for the straggler term:
// over every process in the files (LOCKSTEP_TRACE files, one rank's or
// merged; e.g. N ranks under no_sync) and every step after `skip`, the
// time from one forward to the next, as a robust standard deviation (1.4826
// x the median absolute deviation) over the median. Throws Error with fewer
// than 4 such steps.
double compute_jitter(const std::vector<std::string>& paths, int skip = 2);

// The bucket timeline of `timeline` with the forward, backward and rest of
// `compute` (e.g. a trace of N ranks under no_sync, where ranks contend for
// cores and memory as they will when synchronised); ready times stretch
// with backward. A no_sync trace does not time backward (from_trace then
// gives 0 and puts everything after forward in other_ms): it is split in
// the timeline's proportion of backward to the rest.
Workload with_compute_of(const Workload& timeline, const Workload& compute);

// Timings from a LOCKSTEP_STATS file (<prefix>.rank<r>.json): compute and
// data loading; backward is taken as `backward_share` of compute, buckets
// are its bucket sizes, ready evenly through backward.
Workload from_stats(const std::string& path, double backward_share = 2.0 / 3);

// Replaces the gradients by the description's finer ones (in backward
// order), each ready when the measured curve of bytes-ready-over-time
// reaches it, so that smaller buckets than the traced ones can be planned.
Workload refine_gradients(const Workload& measured, const Description& d);

// A profile of batch w.batch at another batch: forward, backward and the
// gradients' ready times scale linearly with the batch; the rest of the
// step (the optimizer) and data loading are kept. An approximation (fixed
// per-layer costs do not scale): a profile at the batch itself is better.
// Throws InvalidArgument when w.batch is not known (0).
Workload rescale_batch(const Workload& w, int batch);

// A bucket as DDP plans it: gradients in backward order, the first bucket
// closed at `first_bucket_bytes` (or the cap, if smaller), the others at the cap (plan_buckets in
// src/ddp/bucket_plan.cc); ready when its last gradient is.
struct PlannedBucket {
  double bytes = 0;
  double ready_ms = 0;
};
std::vector<PlannedBucket> plan(const std::vector<Gradient>& gradients, double bucket_cap_bytes,
                                double first_bucket_bytes = 1 << 20);

}  // namespace lockstep::sim
