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

// The median, over the all-reduce rows `fit_allreduce` would fit, of the
// share of the time a rank's process was on a core (its CPU time over the
// wall time, at most 1); 0 when the rows carry no CPU times (tables, or
// JSON from before they were recorded).
double comm_cpu_share(const std::vector<cli::BenchRow>& rows, double min_bytes = 0);

// A single-host cluster with the fitted link inside and between hosts, for
// `lockstep simulate --cluster`, as JSON text; and back.
std::string cluster_json(const Cluster& c);
Cluster parse_cluster_json(const std::string& text);

}  // namespace lockstep::sim
