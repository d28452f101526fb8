// An event simulation of one synchronous data-parallel step: buckets become
// ready during backward at their profiled times, their all-reduces run on
// the group one at a time in bucket order (a bucket waits for its
// predecessor), overlapping the rest of backward; whatever runs past the
// end of backward is exposed. Optional terms: the slowest rank's extra
// compute (stragglers), data loading, DDP's copies of gradients into the
// buckets and back, and the core that compute shares with communication
// where a rank has no spare one. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "simulate/cost_model.h"
#include "simulate/workload.h"

namespace lockstep::sim {

struct BucketTiming {
  double bytes = 0;
  double ready_ms = 0;  // after backward starts (wall time: copies and core sharing included)
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
  double copy_ms = 0;        // the compute thread's work on the buckets: copies or a hook's narrowing (CpuCosts)
  double sharing_ms = 0;     // backward slowed by collectives running on its core
  std::vector<BucketTiming> buckets;
};

// What a rank's communication costs its compute in CPU. The defaults (all
// free) hold where transfers have their own engines: a GPU's copy engines
// and NCCL's kernels, or a spare core for the communication thread.
struct CpuCosts {
  // Work on the compute thread per byte of a bucket before it can launch
  // (in backward, when its last gradient is ready): a copy of the gradients
  // into the bucket, or a compression hook's narrowing to 16 bits.
  // lockstep's reducer copies nothing after its first step (it reduces out
  // of place between two sets of buckets, or in place with
  // gradient_as_bucket_view), so for plain all-reduces this is 0.
  double copy_us_per_byte = 0;
  // Per bucket byte after the last all-reduce, on the compute thread (a
  // copy of the averages back into the gradients; 0 for lockstep's reducer).
  double copy_back_us_per_byte = 0;
  // The share of a collective's time that its thread keeps a core busy
  // (1 for shm, which copies and spins; less for tcp, which waits on the
  // link). Costs compute only where `shared_core`.
  double comm_cpu_share = 0;
  // Fewer than two cores per rank at this world size (without_spare_core:
  // the host's cores over the ranks on it, where known): the communication
  // thread and backward share one. The scheduler then gives the communication thread what it
  // asks for up to half the core and backward the rest, so while a
  // collective overlaps backward, backward runs at 1 - min(share, 1/2) of
  // its speed and the collective at min(share, 1/2) / share of its own.
  bool shared_core = false;
  // Where the all-reduce was calibrated beside compute (bench --busy): the
  // speed of a bucket's all-reduce while backward runs on its core, as a
  // fraction of its speed alone (the idle rows' time over the busy rows'
  // at its size). It then replaces min(share, 1/2) / share for the
  // collective; backward's speed stays.
  std::function<double(double bytes)> speed_beside_compute;
};

// `collective_ms(bytes)`: one bucket's all-reduce, alone on the machine.
StepPrediction simulate_step(const Workload& w, const std::vector<PlannedBucket>& buckets,
                             const std::function<double(double bytes)>& collective_ms, double straggler_ms = 0,
                             const CpuCosts& cpu = {});

// What to simulate at each world size.
struct Scenario {
  Cluster cluster;
  double bucket_cap_mb = 25;
  std::string hook = "none";  // none, fp16, bf16: 16-bit gradients halve the bytes on the wire
  int accumulation = 1;       // micro-batches per synchronised step (no_sync on the others)
  double jitter = 0;          // per-rank compute spread (standard deviation / mean)
  bool bucket_view = false;   // gradient_as_bucket_view: in place in one set of buckets (no copies either way)
};

// One bucket's all-reduce under the scenario's hook at `ranks`, in ms: the
// fp32 link for plain all-reduces; for fp16 / bf16 the hook's calibrated
// 16-bit rate (Cluster::Hook16) on half the bytes plus the widening after
// it, or, uncalibrated, the fp32 link at half the bytes.
double bucket_allreduce_ms(const Scenario& s, int ranks, double bytes);

// The CPU costs of the scenario's cluster (copy rate, communication's CPU
// share, cores per rank) for a world of `ranks`.
CpuCosts cpu_costs(const Scenario& s, int ranks);

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

// The step predicted from each of several profiles of one job (the compute
// of separate runs: a machine's speed moves between runs, and a short step
// moves with it): the prediction's run-to-run interval, and which profile
// stands for the job (the one whose step is the median; of an even count,
// the lower middle one). Throws InvalidArgument for no profiles.
struct StepInterval {
  double low_ms = 0;
  double high_ms = 0;
  std::size_t typical = 0;  // index into the profiles
};
StepInterval step_interval(const std::vector<Workload>& profiles, const Scenario& s, int ranks);
// The same from the step each profile predicts (by index). Throws
// InvalidArgument for none.
StepInterval interval_of(const std::vector<double>& steps_ms);

// The slowest of n ranks whose compute varies with relative spread
// `jitter`: the expected maximum of n normal draws,
// compute * jitter * expected_max_of_normals(n) above the mean.
double straggler_ms(double compute_ms, double jitter, int ranks);

// The expected largest of n standard normal draws: 0 for one, 1/sqrt(pi)
// for two, 3.24 for 1024; it grows like sqrt(2 ln n) but stays below it.
double expected_max_of_normals(int n);

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
