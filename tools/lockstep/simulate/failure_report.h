// `lockstep simulate --node-mtbf-hours H`: what failures cost the job at
// each world size under each recovery mode (src/simulate/failure_model.h),
// for report.md and --json: the best checkpoint interval for the restart
// beside Young's and Daly's, the expected efficiency and the time lost per
// failure, each checked against the Monte Carlo timeline. Pure functions;
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulate/failure_model.h"

namespace lockstep::cli {

// What the command line says about failures and recovery.
struct FailureOptions {
  double node_mtbf_h = 0;           // 0: failures are not modelled
  double failures_per_rank_hour = 0;  // instead of node_mtbf_h
  double job_h = 24;
  double checkpoint_gb = 0;         // 0: parameters and Adam's two moments, fp32
  double storage_gb_per_s = 5;
  std::int64_t checkpoint_every = 0;  // 0: the best
  double restart_s = 60;            // besides reading the checkpoint
  double detect_s = 1;
  double replace_join_s = 5;        // besides sending the state
  int shards_per_rank = 1;
  std::vector<double> step_after_losses;  // in place: measured steps after 1, 2, ... losses, over the clean one
  bool given() const { return node_mtbf_h > 0 || failures_per_rank_hour > 0; }
};

// One world size's scenario and what each mode costs there.
struct FailureRow {
  int ranks = 0;
  sim::FailureScenario scenario;
  std::vector<sim::FailureCost> predicted;  // restart, in place, replace
  std::vector<sim::FailureCost> simulated;  // the same, from the timeline
  double young_steps = 0;
  double daly_steps = 0;
};

// The scenario at `ranks` ranks of `ranks_per_host`, a clean step of
// `step_s` of which `compute_share` is compute, `state_bytes` of
// parameters and optimizer state, state sent to a replacement at
// `link_gb_per_s`.
FailureRow failure_row(const FailureOptions& o, int ranks, int ranks_per_host, double step_s, double compute_share,
                       double state_bytes, double link_gb_per_s);

std::string render_failures(const FailureOptions& o, const std::vector<FailureRow>& rows);
nlohmann::json failures_json(const std::vector<FailureRow>& rows);

}  // namespace lockstep::cli
