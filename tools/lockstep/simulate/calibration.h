// Fits an algorithm's cost model (latency alpha, per-byte beta and, where
// the measurements can tell it apart, the reduction's gamma) to all-reduce
// times measured by `lockstep bench`, by least squares on the relative
// error. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/bench_table.h"
#include "simulate/cost_model.h"

namespace lockstep::sim {

struct Fit {
  Link link;
  double gamma_us_per_byte = 0;
  // False when every row has the same ratio of reduced to sent bytes (a
  // ring at any n, or one world size): gamma then stays in beta.
  bool gamma_separate = false;
  std::size_t rows = 0;      // rows fitted
  std::size_t outliers = 0;  // rows left out: far off the line most rows agree on
  double mean_error = 0;  // mean |predicted - measured| / measured over the fitted rows
  double max_error = 0;
};

// Rows of other ops, of one rank, or under `min_bytes` are left out, and
// so are outliers: with 4 rows or more, rows far (over twice the median
// error) from the two-row line most rows agree on.
// Throws InvalidArgument when fewer than two rows remain.
Fit fit_allreduce(const std::vector<cli::BenchRow>& rows, Algorithm algorithm, double min_bytes = 0);

// The same for the rows of one collective, `op` as bench names it:
// allreduce, allgather or reduce_scatter, each with its own step counts
// and volumes (flat_terms, allgather_terms, reduce_scatter_terms) and
// bench's size (the whole buffer: the all-gather's output, the
// reduce-scatter's input).
Fit fit_collective(const std::vector<cli::BenchRow>& rows, const std::string& op, Algorithm algorithm,
                   double min_bytes = 0);

// The median, over the all-reduce rows `fit_allreduce` would fit, of the
// share of the time a rank's process was on a core (its CPU time over the
// wall time, at most 1); 0 when the rows carry no CPU times (tables, or
// JSON from before they were recorded).
double comm_cpu_share(const std::vector<cli::BenchRow>& rows, double min_bytes = 0);

// Above this mean relative error a calibration is reported as poor: the
// model's predictions inherit the error (a 35% fit gave 40-70% errors in
// step time), so the user is told to re-measure.
constexpr double kPoorFitError = 0.15;

// A cluster fitted to one or more `lockstep bench` runs: the fp32
// all-reduce rows set the links (DDP's plain all-reduce), half and bfloat16
// rows the fp16 and bf16 hooks' rates (Cluster::Hook16), fp32 allgather
// and reduce_scatter rows those of fully sharded training
// (Cluster::allgather, reduce_scatter). `notes` say where each term came
// from; `warnings` what is wrong with the measurements and what to do.
struct Calibration {
  Cluster cluster;
  Fit fit;
  Algorithm algorithm = Algorithm::ring;
  double min_bytes = 0;
  std::vector<std::string> notes;
  std::vector<std::string> warnings;
};

// `algorithm_name` empty: the backend's; `min_bytes` < 0: the backend's
// large-message threshold; `ranks_per_host` 0: the bench run's (its --json
// records it; a table does not, and then all its ranks are taken as one
// host's, with a note). Throws InvalidArgument without fp32 all-reduce rows.
Calibration calibrate_cluster(const std::vector<cli::BenchRow>& rows, const std::string& algorithm_name,
                              double min_bytes, int ranks_per_host);

// The warning for a calibration whose mean error is above kPoorFitError
// (empty otherwise): what it means and what to do.
std::string poor_fit_warning(double mean_error, const std::string& what);

// A single-host cluster with the fitted link inside and between hosts, for
// `lockstep simulate --cluster`, as JSON text; and back.
std::string cluster_json(const Cluster& c);
Cluster parse_cluster_json(const std::string& text);

}  // namespace lockstep::sim
