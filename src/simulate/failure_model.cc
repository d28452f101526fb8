// The failure model; see failure_model.h. Times in seconds.
#include "simulate/failure_model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

double node_mtbf_s(const FailureScenario& s) { return s.node_mtbf_h * 3600; }
double work_s(const FailureScenario& s) { return s.job_h * 3600; }

// Daly's expected wall time of a segment of `tau` seconds of work followed
// by a checkpoint, with failures (also during the restart and the write)
// at mean interval M: M e^{R/M} (e^{(tau + delta)/M} - 1).
double daly_segment_s(const FailureScenario& s, double tau) {
  const double m = system_mtbf_s(s);
  return m * std::exp(s.restart_s / m) * std::expm1((tau + s.checkpoint_s) / m);
}

std::int64_t interval_of(const FailureScenario& s) {
  return s.checkpoint_every > 0 ? s.checkpoint_every : best_checkpoint_interval(s);
}

// A step after `lost` of `nodes` nodes are gone: the logical shards (one
// per rank at start, `shards_per_rank` with more) are shared out, so the
// rank holding the most computes ceil(shards / survivors) of them and
// every rank waits for it. Communication is taken as unchanged. Where the
// step was measured after that many losses, the measurement.
double slowed_step_s(const FailureScenario& s, int lost) {
  if (lost <= 0) return s.step_s;
  if (static_cast<std::size_t>(lost) <= s.step_after_losses.size())
    return s.step_s * s.step_after_losses[static_cast<std::size_t>(lost) - 1];
  const double per_rank = std::ceil(static_cast<double>(s.shards_per_rank) * s.nodes / (s.nodes - lost)) /
                          s.shards_per_rank;
  return s.step_s * (1 - s.compute_share) + s.step_s * s.compute_share * per_rank;
}

// The checkpoints' writes over the job, without failures: one after each
// interval's work.
double checkpoints_s(const FailureScenario& s) {
  return std::ceil(work_s(s) / (static_cast<double>(interval_of(s)) * s.step_s)) * s.checkpoint_s;
}

// In place, the survivors go on while any node is left: a node the
// launchers saw die counts as gone, not as the other side of a partition,
// so no majority is needed (docs/faults.md, "No split brain"). The job
// restarts from its checkpoint once the last one fails.
bool goes_on(const FailureScenario& s, int lost) { return lost < s.nodes; }

FailureCost finish(const FailureScenario& s, Recovery recovery, double wall_s, double failures) {
  FailureCost c;
  c.recovery = recovery;
  c.checkpoint_every = interval_of(s);
  c.efficiency = work_s(s) / wall_s;
  c.failures = failures;
  // What failures cost, beyond what the checkpoints cost without any.
  const double clean = work_s(s) + checkpoints_s(s);
  c.lost_per_failure_s = failures > 0 ? std::max(0.0, wall_s - clean) / failures : 0;
  return c;
}

void check(const FailureScenario& s) {
  if (!(s.step_s > 0) || s.nodes < 1 || !(s.node_mtbf_h > 0) || !(s.job_h > 0) || s.checkpoint_s < 0 ||
      s.restart_s < 0 || s.detect_s < 0 || s.replace_s < 0 || s.shards_per_rank < 1 || s.compute_share < 0 ||
      s.compute_share > 1 || std::any_of(s.step_after_losses.begin(), s.step_after_losses.end(),
                                         [](double x) { return !(x > 0); }))
    throw InvalidArgument("failure model: times and rates must be positive (step, MTBF, job length, the steps "
                          "after losses) or at least 0 (checkpoint, restart, detection, replacement), shards per rank "
                          "at least 1, and the compute share from 0 to 1");
}

}  // namespace

std::string to_string(Recovery r) {
  switch (r) {
    case Recovery::restart: return "restart";
    case Recovery::in_place: return "in-place";
    case Recovery::replace: return "replace";
  }
  return "?";
}

Recovery parse_recovery(const std::string& text) {
  if (text == "restart") return Recovery::restart;
  if (text == "in-place") return Recovery::in_place;
  if (text == "replace") return Recovery::replace;
  throw InvalidArgument(fmt::format("recovery '{}': use restart, in-place or replace", text));
}

double system_mtbf_s(const FailureScenario& s) { return node_mtbf_s(s) / s.nodes; }

double young_interval_steps(const FailureScenario& s) {
  return std::sqrt(2 * s.checkpoint_s * system_mtbf_s(s)) / s.step_s;
}

double daly_interval_steps(const FailureScenario& s) {
  const double m = system_mtbf_s(s), d = s.checkpoint_s;
  if (d >= 2 * m) return m / s.step_s;
  const double tau = std::sqrt(2 * d * m) * (1 + std::sqrt(d / (2 * m)) / 3 + d / (9 * 2 * m)) - d;
  return std::max(tau, s.step_s) / s.step_s;
}

std::int64_t best_checkpoint_interval(const FailureScenario& s) {
  check(s);
  // The expected wall time per second of work is convex in the interval:
  // a search over whole steps, on a log grid refined around its minimum.
  const auto cost = [&](double steps) { return daly_segment_s(s, steps * s.step_s) / (steps * s.step_s); };
  const double most = std::max(1.0, std::min(work_s(s) / s.step_s, 1e9));
  double best = 1, best_cost = cost(1);
  for (double k = 1; k <= most; k *= 1.05) {
    const double c = cost(std::floor(k));
    if (c < best_cost) best = std::floor(k), best_cost = c;
  }
  for (double k = std::max(1.0, std::floor(best / 1.05)); k <= std::ceil(best * 1.05); ++k)
    if (cost(k) < best_cost) best = k, best_cost = cost(k);
  return static_cast<std::int64_t>(best);
}

FailureCost predict_failures(const FailureScenario& s, Recovery recovery) {
  check(s);
  const double m = system_mtbf_s(s);
  const double w = work_s(s);
  if (recovery == Recovery::restart) {
    const double tau = static_cast<double>(interval_of(s)) * s.step_s;
    const double wall = w / tau * daly_segment_s(s, tau);
    return finish(s, recovery, wall, wall / m);
  }
  if (recovery == Recovery::replace) {
    // Each failure: the detection, half a step redone on average, and the
    // replacement's feeding, during which the job runs one node short.
    const double short_by = std::max(0.0, 1 - s.step_s / slowed_step_s(s, 1));
    const double per_failure = s.detect_s + s.step_s / 2 + s.replace_s * short_by;
    const double wall = (w + checkpoints_s(s)) / (1 - per_failure / m);
    return finish(s, recovery, wall, wall / m);
  }
  // In place: the chance of having lost k nodes as the work progresses (the
  // Kolmogorov equations of the chain, in work rather than wall time, where
  // state k runs at speed v_k and loses its next node at rate
  // (nodes - k) / node MTBF per wall second), integrated over the job. A
  // failure costs the detection and half a step; the last node's, the
  // restart and half an interval, back at full size.
  const double tau = static_cast<double>(interval_of(s)) * s.step_s;
  const int most_lost = s.nodes - 1;
  std::vector<double> speed, rate;  // per state: work per wall second; failures per work second
  for (int k = 0; k <= most_lost; ++k) {
    speed.push_back(s.step_s / slowed_step_s(s, k));
    rate.push_back((s.nodes - k) / node_mtbf_s(s) / speed.back());
  }
  const double fastest = *std::max_element(rate.begin(), rate.end());
  const auto pieces = static_cast<std::int64_t>(std::clamp(std::ceil(w * fastest / 0.01), 2000.0, 2e6));
  const double dp = w / static_cast<double>(pieces);
  std::vector<double> chance(speed.size(), 0.0), next(speed.size(), 0.0);
  chance[0] = 1;
  // The states with a chance worth counting are the first few (at 1024
  // nodes, losing hundreds within one job has a chance far below 1e-15):
  // those are integrated, and the next one gathers its chance until it is
  // worth counting too; walking every state each piece would be slow.
  int top = 0;
  double wall = checkpoints_s(s), failures = 0;
  for (std::int64_t i = 0; i < pieces; ++i) {
    const int gathering = std::min(top + 1, most_lost);
    std::copy(chance.begin(), chance.begin() + gathering + 1, next.begin());
    for (int k = 0; k <= top; ++k) {
      wall += chance[k] * dp / speed[k];
      const double failing = chance[k] * rate[k] * dp;
      failures += failing;
      next[k] -= failing;
      if (k < most_lost) {
        next[k + 1] += failing;
        wall += failing * (s.detect_s + slowed_step_s(s, k) / 2);
      } else {
        next[0] += failing;
        wall += failing * (s.restart_s + tau / 2);
      }
    }
    std::copy(next.begin(), next.begin() + gathering + 1, chance.begin());
    if (gathering > top && chance[gathering] > 1e-15) top = gathering;
  }
  return finish(s, recovery, wall, failures);
}

FailureCost simulate_failures(const FailureScenario& s, Recovery recovery, int trials, std::uint64_t seed) {
  check(s);
  if (trials < 1) throw InvalidArgument(fmt::format("failure model: {} simulated jobs; ask for at least one", trials));
  std::mt19937_64 random(seed);
  const double w = work_s(s);
  const double tau = static_cast<double>(interval_of(s)) * s.step_s;
  // The walls' mean and squared deviations, a job at a time (Welford's:
  // exact where every job takes the same time).
  double wall_mean = 0, wall_deviations = 0, failure_sum = 0;
  for (int t = 0; t < trials; ++t) {
    double wall = 0, done = 0, failures = 0;
    int lost = 0;
    // The next failure among the nodes up now (each at its own rate).
    const auto next_failure = [&](int up) {
      return std::exponential_distribution<double>(up / node_mtbf_s(s))(random);
    };
    if (recovery == Recovery::restart) {
      double saved = 0;  // work in the last checkpoint
      while (saved < w) {
        const double gap = next_failure(s.nodes);
        // The segment and its checkpoint.
        const double segment = std::min(tau, w - saved);
        const double to_finish = segment + s.checkpoint_s;
        if (gap >= to_finish) {
          wall += to_finish;
          saved += segment;
          continue;
        }
        // A failure: the segment is lost; the restart may fail too.
        wall += gap;
        failures += 1;
        for (;;) {
          const double again = next_failure(s.nodes);
          if (again >= s.restart_s) break;
          wall += again;
          failures += 1;
        }
        wall += s.restart_s;
      }
    } else {
      wall = checkpoints_s(s);   // written as the job goes
      double since_replace = 0;  // replace: how long the lost node has been gone
      bool replacing = false;
      while (done < w) {
        const double step = slowed_step_s(s, lost);
        const double gap = next_failure(s.nodes - lost);
        // Until the job is whole again (replace), or to the end.
        const double horizon = replacing ? s.replace_s - since_replace : 1e300;
        const double work_left_wall = (w - done) * step / s.step_s;
        const double run = std::min({gap, horizon, work_left_wall});
        wall += run;
        done += run * s.step_s / step;
        if (replacing) since_replace += run;
        if (run == work_left_wall) break;
        if (run == horizon) {  // the replacement trains
          replacing = false;
          lost = 0;
          continue;
        }
        failures += 1;
        // The interrupted step's elapsed part, redone after the re-form.
        const double elapsed = std::fmod(run, step);
        ++lost;
        if (recovery == Recovery::in_place) {
          if (goes_on(s, lost)) {
            wall += s.detect_s;
            done -= elapsed * s.step_s / step;
          } else {
            wall += s.restart_s;
            done = std::floor(done / tau) * tau;  // back to the last checkpoint
            lost = 0;
          }
        } else {
          wall += s.detect_s;
          done -= elapsed * s.step_s / step;
          if (!replacing) since_replace = 0;
          replacing = true;
          if (!goes_on(s, lost)) {
            wall += s.restart_s;
            done = std::floor(done / tau) * tau;
            lost = 0;
            replacing = false;
          }
        }
      }
    }
    const double from_mean = wall - wall_mean;
    wall_mean += from_mean / (t + 1);
    wall_deviations += from_mean * (wall - wall_mean);
    failure_sum += failures;
  }
  FailureCost cost = finish(s, recovery, wall_mean, failure_sum / trials);
  cost.job_spread = trials > 1 ? std::sqrt(wall_deviations / (trials - 1)) / wall_mean : 0;
  return cost;
}

}  // namespace lockstep::sim
