// What failures cost a long job (docs/scaling.md, "What failures cost"):
// nodes fail at random (a Poisson process, one mean time between failures
// per node), and the job recovers in one of three ways:
//   restart   every rank stops and starts again from the last checkpoint
//             (torchrun's way): each failure costs the restart and the work
//             since that checkpoint, and every checkpoint costs its write;
//   in place  the survivors re-form and redo the interrupted step (lockstep
//             run --on-rank-failure continue): each failure costs the
//             detection and about half a step, but the job goes on with
//             fewer nodes, so later steps are slower; it goes on while a
//             node is left (a death the launchers see needs no majority)
//             and restarts from its checkpoint when the last one fails;
//   replace   in place, then a replacement node fed from its peers' memory
//             brings the job back to full size after `replace_s`.
// Two answers for each: an analytic one (Daly's expected time of a
// checkpointed segment under exponential failures for the restart; first
// order in the failure rate for the others) and a Monte Carlo simulation
// of the job's timeline, which checks it. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::sim {

enum class Recovery { restart, in_place, replace };
std::string to_string(Recovery r);
Recovery parse_recovery(const std::string& text);  // restart, in-place, replace

struct FailureScenario {
  double step_s = 1;            // a clean step at the full world size
  int nodes = 1;
  double node_mtbf_h = 1000;    // mean time between failures of one node, hours
  double job_h = 24;            // the clean job's length, hours (in place: how long capacity is short)
  double checkpoint_s = 0;      // writing one checkpoint, during which training waits
  double restart_s = 0;         // stop, start, initialise, rendezvous, read the checkpoint
  double detect_s = 1;          // in place: the death to the survivors' re-formed group
  double replace_s = 0;         // replace: the death to the replacement training at full size
  // Steps between checkpoints; 0: the best for the restart. In place and
  // with replacements the job writes them too (the loss of the last node
  // falls back to the restart).
  std::int64_t checkpoint_every = 0;
  // In place: logical shards per rank at start (ResilientOptions::shards /
  // world size) and the share of a step that is compute, which the rank
  // holding the most shards after a loss multiplies.
  int shards_per_rank = 1;
  double compute_share = 1;
  // In place: the step measured with 1, 2, ... nodes lost, as a multiple of
  // the clean step, where no per-node rule holds (ranks that share a host's
  // cores: a survivor holding two shards gets the dead rank's core time
  // too). Losses beyond the list follow compute_share's rule.
  std::vector<double> step_after_losses;
};

struct FailureCost {
  Recovery recovery = Recovery::restart;
  std::int64_t checkpoint_every = 0;  // the interval used (restart)
  double efficiency = 1;              // clean wall time / expected wall time, for the same work
  double lost_per_failure_s = 0;      // expected wall time lost per failure
  double failures = 0;                // expected failures over the job
  // One job's wall time varies with how many failures it draws and when:
  // the standard deviation of the simulated jobs' walls over their mean
  // (simulate_failures only; 0 from predict_failures). A mean of n jobs
  // varies by this over sqrt(n): what a measurement of a few jobs can
  // resolve.
  double job_spread = 0;
};

// The system's mean time between failures, seconds.
double system_mtbf_s(const FailureScenario& s);

// The interval (steps) that minimises the restart's expected wall time
// under Daly's model, searched numerically.
std::int64_t best_checkpoint_interval(const FailureScenario& s);
// The textbook answers, in steps: Young's sqrt(2 delta M) and Daly's
// higher-order one, for comparison with the search and the simulation.
double young_interval_steps(const FailureScenario& s);
double daly_interval_steps(const FailureScenario& s);

FailureCost predict_failures(const FailureScenario& s, Recovery recovery);

// The job's timeline under random failures, `trials` times (seeded: the same
// answer every run); efficiency and the loss per failure averaged, and the
// jobs' spread.
FailureCost simulate_failures(const FailureScenario& s, Recovery recovery, int trials = 200,
                              std::uint64_t seed = 1);

}  // namespace lockstep::sim
