// The failure model of `lockstep simulate` (src/simulate/failure_model.h):
// its analytic answers against its own Monte Carlo timeline, the best
// checkpoint interval against Young's and Daly's, and the ordering a user
// relies on when choosing a recovery mode.
#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/error.h"
#include "simulate/failure_model.h"

namespace lockstep::sim {
namespace {

// 1024 ranks as 128 nodes of 8, a node failing every 500 hours on average
// (the system every 3.9 h), 1 s steps of which 80% compute, a 24-hour job;
// a 60 s checkpoint write, a 5-minute restart, 2 s to re-form in place and
// 30 s to feed a replacement.
FailureScenario at_scale() {
  FailureScenario s;
  s.step_s = 1;
  s.nodes = 128;
  s.node_mtbf_h = 500;
  s.job_h = 24;
  s.checkpoint_s = 60;
  s.restart_s = 300;
  s.detect_s = 2;
  s.replace_s = 30;
  s.compute_share = 0.8;
  return s;
}

TEST(FailureModel, DalysSegmentMatchesTheSimulatedRestart) {
  FailureScenario s = at_scale();
  for (std::int64_t every : {600, 1800, 3600, 14400}) {
    s.checkpoint_every = every;
    const FailureCost predicted = predict_failures(s, Recovery::restart);
    const FailureCost simulated = simulate_failures(s, Recovery::restart, 400);
    EXPECT_NEAR(predicted.efficiency, simulated.efficiency, 0.01) << "every " << every;
    EXPECT_NEAR(predicted.failures, simulated.failures, 0.15 * predicted.failures + 0.3) << "every " << every;
  }
}

TEST(FailureModel, TheBestIntervalIsDalysAndTheSimulationsBest) {
  FailureScenario s = at_scale();
  const std::int64_t best = best_checkpoint_interval(s);
  // Young's and Daly's textbook answers land near the search's optimum.
  EXPECT_NEAR(daly_interval_steps(s), static_cast<double>(best), 0.05 * best);
  EXPECT_NEAR(young_interval_steps(s), static_cast<double>(best), 0.15 * best);
  // And the simulated job is no faster at half or twice the interval.
  s.checkpoint_every = best;
  const double at_best = simulate_failures(s, Recovery::restart, 400).efficiency;
  for (double factor : {0.25, 4.0}) {
    s.checkpoint_every = static_cast<std::int64_t>(best * factor);
    EXPECT_LT(simulate_failures(s, Recovery::restart, 400).efficiency, at_best + 0.002) << "x" << factor;
  }
}

TEST(FailureModel, InPlaceAndReplaceMatchTheirSimulation) {
  const FailureScenario s = at_scale();
  for (Recovery r : {Recovery::in_place, Recovery::replace}) {
    const FailureCost predicted = predict_failures(s, r);
    const FailureCost simulated = simulate_failures(s, r, 400);
    EXPECT_NEAR(predicted.efficiency, simulated.efficiency, 0.03) << to_string(r);
  }
}

// In place the survivors go on while any node is left (deaths the
// launchers see do not count against a majority): four nodes that each
// fail with a chance of 0.39 within the job lose two or more in half the
// runs, all four in about 2%. Were half the nodes lost a restart (half an
// hour here), the efficiency would fall below 0.8; going on costs the
// detection and, rarely, the restart: above 0.97, in the formula and in
// the simulation alike.
TEST(FailureModel, InPlaceGoesOnUntilTheLastNodeFails) {
  FailureScenario s;
  s.step_s = 1;
  s.nodes = 4;
  s.node_mtbf_h = 2;
  s.job_h = 1;
  s.restart_s = 1800;
  s.detect_s = 1;
  s.compute_share = 0;
  s.checkpoint_every = 600;
  EXPECT_GT(predict_failures(s, Recovery::in_place).efficiency, 0.97);
  EXPECT_GT(simulate_failures(s, Recovery::in_place, 2000).efficiency, 0.97);
}

// Ranks that share a host's cores do not follow the per-node rule: a
// survivor holding two shards also gets the dead rank's core time. The
// steps measured after each loss replace the rule: the rule's own values
// as a list give the rule's answer exactly; a list from a shared host
// (1.25x after one loss, as fast as clean after two or three) costs less,
// in the formula and the simulation alike.
TEST(FailureModel, StepsMeasuredAfterLossesReplaceTheRule) {
  FailureScenario s;
  s.step_s = 0.05;
  s.nodes = 4;
  s.node_mtbf_h = 45.0 / 3600;
  s.job_h = 60.0 / 3600;
  s.restart_s = 2;
  s.detect_s = 0.02;
  s.compute_share = 1;  // the rule: 2x after one or two losses, 4x after three
  s.checkpoint_every = 100;
  const FailureCost rule = predict_failures(s, Recovery::in_place);
  FailureScenario as_rule = s;
  as_rule.step_after_losses = {2, 2, 4};
  EXPECT_DOUBLE_EQ(predict_failures(as_rule, Recovery::in_place).efficiency, rule.efficiency);
  FailureScenario shared = s;
  shared.step_after_losses = {1.25, 1, 1};
  const FailureCost measured = predict_failures(shared, Recovery::in_place);
  EXPECT_GT(measured.efficiency, rule.efficiency + 0.1);
  EXPECT_NEAR(measured.efficiency, simulate_failures(shared, Recovery::in_place, 2000).efficiency, 0.02);
  // Only the first entries given: the rule beyond them.
  FailureScenario first_only = s;
  first_only.step_after_losses = {2};
  EXPECT_DOUBLE_EQ(predict_failures(first_only, Recovery::in_place).efficiency, rule.efficiency);
  shared.step_after_losses = {1.25, 0};
  EXPECT_THROW(predict_failures(shared, Recovery::in_place), InvalidArgument);
}

TEST(FailureModel, ReplacementsLoseLeastAndInPlaceAloneSlowsTheJob) {
  const FailureScenario s = at_scale();
  const FailureCost restart = predict_failures(s, Recovery::restart);
  const FailureCost in_place = predict_failures(s, Recovery::in_place);
  const FailureCost replace = predict_failures(s, Recovery::replace);
  EXPECT_GT(replace.efficiency, restart.efficiency);
  EXPECT_LT(replace.lost_per_failure_s, 0.1 * restart.lost_per_failure_s);
  // One shard per rank: after a loss, a survivor computes two, and every
  // rank waits for it.
  EXPECT_LT(in_place.efficiency, replace.efficiency);
  // With 8 shards per rank, a loss costs 9/8 of the compute, not 2x.
  FailureScenario finer = s;
  finer.shards_per_rank = 8;
  EXPECT_GT(predict_failures(finer, Recovery::in_place).efficiency, in_place.efficiency);
}

TEST(FailureModel, NoFailuresCostNothingButTheCheckpoints) {
  FailureScenario s = at_scale();
  s.node_mtbf_h = 1e12;
  s.checkpoint_every = 3600;
  const double clean = 24 * 3600.0 / (24 * 3600.0 + 24 * 60.0);
  for (Recovery r : {Recovery::restart, Recovery::in_place, Recovery::replace})
    EXPECT_NEAR(predict_failures(s, r).efficiency, clean, 1e-3) << to_string(r);
}

TEST(FailureModel, BadInputIsRefused) {
  FailureScenario s = at_scale();
  s.node_mtbf_h = 0;
  EXPECT_THROW(predict_failures(s, Recovery::restart), InvalidArgument);
  EXPECT_THROW(parse_recovery("sometimes"), InvalidArgument);
}

// A job's wall varies with the failures it draws: replaced at once, each
// costing a fixed 2 s of detection and no slower step, a 100 s job over 4
// nodes failing every 25 s each draws N ~ Poisson(16) failures and takes
// 100 + 2N s: a standard deviation of 2 x 4 = 8 s over a mean of 132 s.
// The simulation says so; the formula, which knows no spread, says 0.
TEST(FailureModel, TheSimulationGivesOneJobsSpread) {
  FailureScenario s;
  s.step_s = 0.001;
  s.nodes = 4;
  s.node_mtbf_h = 25.0 / 3600;
  s.job_h = 100.0 / 3600;
  s.detect_s = 2;
  s.replace_s = 0;
  s.compute_share = 0;
  s.checkpoint_every = 1'000'000;
  const FailureCost simulated = simulate_failures(s, Recovery::replace, 4000);
  EXPECT_NEAR(simulated.failures, 16, 0.5);
  EXPECT_NEAR(simulated.job_spread, 8.0 / 132, 0.1 * 8.0 / 132);
  EXPECT_EQ(predict_failures(s, Recovery::replace).job_spread, 0);
  s.node_mtbf_h = 1e9;  // no failure: every job alike
  EXPECT_LT(simulate_failures(s, Recovery::replace, 100).job_spread, 1e-9);
  EXPECT_THROW(simulate_failures(s, Recovery::replace, 0), InvalidArgument);
}

}  // namespace
}  // namespace lockstep::sim
