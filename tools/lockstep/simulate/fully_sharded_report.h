// `lockstep simulate --strategy fsdp`: the fully sharded step's
// predictions beside DDP's on the same model, for report.md and --json,
// and the sharding choices (prefetch, resharding, 16-bit parameters or
// gradients) that would shorten the step, with what each costs in memory.
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulate/fully_sharded_step.h"
#include "simulate/step_simulation.h"

namespace lockstep::cli {

// One world size: the fully sharded step and DDP's; with several profiled
// runs (--compute-trace), `fsdp` is the run whose step is the median and
// `profiled_runs` the number of runs `interval` ranges over.
struct ShardedComparison {
  sim::ShardedScalePrediction fsdp;
  sim::ScalePrediction ddp;
  sim::StepInterval interval;
  std::size_t profiled_runs = 1;
};

// Another choice of sharding options and what it predicts.
struct ShardingAlternative {
  std::string change;  // in words, e.g. "--prefetch 2"
  sim::ShardingOptions options;
  double step_ms = 0;
  double memory_bytes = 0;
};

// One option changed at a time from `o`: one more prefetched unit,
// resharding switched, bf16 parameters, bf16 gradients (where fp32).
std::vector<ShardingAlternative> sharding_alternatives(const sim::ShardedWorkload& w, const sim::Scenario& s,
                                                       const sim::ShardingOptions& o, int ranks);

// The sentence above a table whose steps carry their range over several
// profiled runs (DDP's report says it too).
std::string interval_note(std::size_t profiled_runs);

std::string render_sharded(const sim::ShardedWorkload& w, const sim::Scenario& s, const sim::ShardingOptions& o,
                           const std::vector<ShardedComparison>& runs,
                           const std::vector<ShardingAlternative>& alternatives);

nlohmann::json sharded_json(const sim::ShardedWorkload& w, const sim::ShardingOptions& o,
                            const std::vector<ShardedComparison>& runs,
                            const std::vector<ShardingAlternative>& alternatives);

}  // namespace lockstep::cli
