// What `lockstep doctor` concludes from measurements at several world
// sizes: the scaling efficiency and, in plain words with the numbers, why
// the step is slower with more ranks and what to try. Pure functions over
// values; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace lockstep::cli {

// One world size's measurements (the slowest rank's step; averages of the
// other quantities over the ranks).
struct ScalePoint {
  int ranks = 1;
  double step_ms = 0;
  double compute_ms = 0;
  double exposed_ms = 0;
  double comm_ms = 0;
  double data_ms = 0;
  double bytes_per_step = 0;
  double overlap = 1;
  int buckets = 0;
  double bucket_cap_mb = 25;
  std::string compression = "none";
  std::vector<std::string> stragglers;  // one line each, with numbers
};

struct Diagnosis {
  std::vector<double> efficiency;  // per point, against the first
  std::vector<std::string> findings;
  std::vector<std::string> suggestions;
};

// `strong`: the global batch is fixed (efficiency = T1 / (n Tn)); otherwise
// the per-rank batch is (efficiency = T1 / Tn). `cores`: CPUs available.
Diagnosis diagnose(const std::vector<ScalePoint>& points, bool strong, int cores);

// The report as markdown: a table of the measurements, then the findings
// and suggestions.
std::string render_report(const std::vector<ScalePoint>& points, const Diagnosis& d, bool strong,
                          const std::string& workload, int cores);

}  // namespace lockstep::cli
