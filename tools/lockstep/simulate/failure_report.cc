// The failures' section of `lockstep simulate`; see failure_report.h.
#include "simulate/failure_report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace lockstep::cli {
namespace {

const std::vector<sim::Recovery> kModes = {sim::Recovery::restart, sim::Recovery::in_place, sim::Recovery::replace};

std::string seconds_text(double s) {
  if (s < 120) return fmt::format("{:.1f} s", s);
  if (s < 7200) return fmt::format("{:.1f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

}  // namespace

FailureRow failure_row(const FailureOptions& o, int ranks, int ranks_per_host, double step_s, double compute_share,
                       double state_bytes, double link_gb_per_s) {
  FailureRow row;
  row.ranks = ranks;
  sim::FailureScenario& s = row.scenario;
  const int per_host = std::max(1, std::min(ranks_per_host, ranks));
  s.step_s = step_s;
  s.nodes = (ranks + per_host - 1) / per_host;
  s.node_mtbf_h = o.node_mtbf_h > 0 ? o.node_mtbf_h : 1 / (o.failures_per_rank_hour * per_host);
  s.job_h = o.job_h;
  const double checkpoint_bytes = o.checkpoint_gb > 0 ? o.checkpoint_gb * 1e9 : state_bytes;
  s.checkpoint_s = checkpoint_bytes / (o.storage_gb_per_s * 1e9);
  s.restart_s = o.restart_s + s.checkpoint_s;  // reading it back as fast as it was written
  s.detect_s = o.detect_s;
  s.replace_s = o.replace_join_s + (link_gb_per_s > 0 ? state_bytes / (link_gb_per_s * 1e9) : 0);
  s.checkpoint_every = o.checkpoint_every;
  s.shards_per_rank = o.shards_per_rank;
  s.compute_share = std::clamp(compute_share, 0.0, 1.0);
  s.step_after_losses = o.step_after_losses;
  row.young_steps = sim::young_interval_steps(s);
  row.daly_steps = sim::daly_interval_steps(s);
  for (sim::Recovery r : kModes) {
    row.predicted.push_back(sim::predict_failures(s, r));
    row.simulated.push_back(sim::simulate_failures(s, r));
  }
  return row;
}

std::string render_failures(const FailureOptions& o, const std::vector<FailureRow>& rows) {
  const sim::FailureScenario& first = rows.front().scenario;
  std::string out = fmt::format(
      "\n## What failures cost\n\nA job of {} (clean), a node failing every {} on average, "
      "checkpoints of {:.3g} GB at {:g} GB/s ({}), a restart of {} besides reading the checkpoint, {} from a death "
      "to the survivors' re-formed group in place, {} logical shard(s) per rank, and a replacement fed from its "
      "peers' memory after {} besides sending the state.\n\n",
      seconds_text(o.job_h * 3600), seconds_text(first.node_mtbf_h * 3600), first.checkpoint_s * o.storage_gb_per_s,
      o.storage_gb_per_s,
      seconds_text(first.checkpoint_s), seconds_text(o.restart_s), seconds_text(o.detect_s), o.shards_per_rank,
      seconds_text(o.replace_join_s));
  if (!o.step_after_losses.empty()) {
    std::vector<std::string> steps;
    for (double x : o.step_after_losses) steps.push_back(fmt::format("{:.2f}x", x));
    out += fmt::format("In place, the step after 1, 2, ... nodes lost as measured: {} the clean one.\n\n",
                       fmt::join(steps, ", "));
  }
  out += "| ranks | nodes | a failure every | failures | checkpoint every (Young, Daly) | restart | in place | "
         "replace | lost per failure: restart, in place, replace | one job's spread: restart, in place, replace "
         "|\n|---|---|---|---|---|---|---|---|---|---|\n";
  double worst = 0;
  for (const FailureRow& r : rows) {
    const sim::FailureScenario& s = r.scenario;
    const std::int64_t every = r.predicted[0].checkpoint_every;
    out += fmt::format("| {} | {} | {} | {:.1f} | {} steps, {} ({:.0f}, {:.0f}) | {:.1f}% | {:.1f}% | {:.1f}% | {}, {}, {} "
                       "| {:.1f}%, {:.1f}%, {:.1f}% |\n",
                       r.ranks, s.nodes, seconds_text(sim::system_mtbf_s(s)), r.predicted[0].failures, every,
                       seconds_text(static_cast<double>(every) * s.step_s), r.young_steps, r.daly_steps,
                       100 * r.predicted[0].efficiency, 100 * r.predicted[1].efficiency,
                       100 * r.predicted[2].efficiency, seconds_text(r.predicted[0].lost_per_failure_s),
                       seconds_text(r.predicted[1].lost_per_failure_s), seconds_text(r.predicted[2].lost_per_failure_s),
                       100 * r.simulated[0].job_spread, 100 * r.simulated[1].job_spread,
                       100 * r.simulated[2].job_spread);
    for (std::size_t m = 0; m < kModes.size(); ++m)
      worst = std::max(worst, std::abs(r.predicted[m].efficiency - r.simulated[m].efficiency));
  }
  out += fmt::format(
      "\nEfficiency: the clean job's time over the expected time with failures, checkpoints included (a clean run "
      "writes them too). The restart's interval is the best for it (or --checkpoint-every), in place and replace "
      "write at the same interval: their fallback when the last node fails. In place alone, a survivor holding "
      "two shards makes every step wait for it: more shards per rank (--shards-per-rank) or replacements keep the "
      "job's speed. The timeline simulation (200 jobs each) agrees with these within {:.1f} points of efficiency; "
      "its jobs' walls vary by the spread given (one standard deviation over the mean; a mean of n jobs, by that "
      "over sqrt(n)): what a few measured jobs can tell apart.\n",
      100 * worst);
  return out;
}

nlohmann::json failures_json(const std::vector<FailureRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const FailureRow& r : rows) {
    nlohmann::json modes = nlohmann::json::object();
    for (std::size_t m = 0; m < kModes.size(); ++m)
      modes[sim::to_string(kModes[m])] = {{"efficiency", r.predicted[m].efficiency},
                                          {"simulated_efficiency", r.simulated[m].efficiency},
                                          {"lost_per_failure_s", r.predicted[m].lost_per_failure_s},
                                          {"failures", r.predicted[m].failures},
                                          {"job_spread", r.simulated[m].job_spread}};
    out.push_back({{"ranks", r.ranks},
                   {"nodes", r.scenario.nodes},
                   {"system_mtbf_s", sim::system_mtbf_s(r.scenario)},
                   {"checkpoint_every", r.predicted[0].checkpoint_every},
                   {"checkpoint_s", r.scenario.checkpoint_s},
                   {"restart_s", r.scenario.restart_s},
                   {"replace_s", r.scenario.replace_s},
                   {"young_steps", r.young_steps},
                   {"daly_steps", r.daly_steps},
                   {"modes", modes}});
  }
  return out;
}

}  // namespace lockstep::cli
