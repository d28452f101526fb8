// The shm backend's spin budget (src/comm/shm/spin_budget.h): its rules,
// and the same class run in a model of ranks doing back-to-back small
// all-reduces, where a rank that out-waits its spin sleeps and is woken a
// fixed time after its peer posts.
//
// What the model can show on a 2-core machine: whether the rule breaks the
// cascade that a fixed spin shorter than a wake-up starts (one hiccup, then
// a wake-up in every operation), and whether ranks that compute between
// operations (a training step) keep the budget, and so the core time spun
// away, near the floor. What it cannot: how long a wake-up really takes on
// a given machine, or how often ranks hiccup there; the 16-core tables in
// docs/performance.md measure that.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "comm/shm/spin_budget.h"

namespace lockstep::shm {
namespace {

constexpr std::int64_t kMicros = 1000;

TEST(SpinBudget, StartsAtTheFloor) {
  EXPECT_EQ(SpinBudget::adaptive().nanos(), SpinBudget::kFloorNanos);
  EXPECT_FALSE(SpinBudget::adaptive().is_fixed());
  EXPECT_TRUE(SpinBudget::fixed(200 * kMicros).is_fixed());
}

TEST(SpinBudget, IsTwiceTheWakeUpCost) {
  SpinBudget budget = SpinBudget::adaptive();
  budget.record_wake(70 * kMicros);
  EXPECT_EQ(budget.wake_nanos(), 70 * kMicros);
  EXPECT_EQ(budget.nanos(), 140 * kMicros);
}

TEST(SpinBudget, OneSlowWakeUpMovesItAQuarterOfTheWay) {
  SpinBudget budget = SpinBudget::adaptive();
  budget.record_wake(40 * kMicros);
  budget.record_wake(440 * kMicros);
  EXPECT_EQ(budget.wake_nanos(), 140 * kMicros);
  for (int i = 0; i < 50; ++i) budget.record_wake(40 * kMicros);
  EXPECT_NEAR(static_cast<double>(budget.nanos()), 80.0 * kMicros, 1.0 * kMicros);
}

TEST(SpinBudget, StaysWithinFloorAndCeiling) {
  SpinBudget budget = SpinBudget::adaptive(20 * kMicros, 1000 * kMicros);
  budget.record_wake(3 * kMicros);  // a busy machine wakes fast: spin no less than the floor
  EXPECT_EQ(budget.nanos(), 20 * kMicros);
  for (int i = 0; i < 50; ++i) budget.record_wake(5000 * kMicros);
  EXPECT_EQ(budget.nanos(), 1000 * kMicros);
}

TEST(SpinBudget, FixedNeverMoves) {
  SpinBudget budget = SpinBudget::fixed(20 * kMicros);
  for (const std::int64_t wake : {1, 30, 300, 30000}) {
    budget.record_wake(wake * kMicros);
    EXPECT_EQ(budget.nanos(), 20 * kMicros);
  }
}

// The machine the model runs on. Times in microseconds.
struct Machine {
  int ranks = 16;
  double compute = 0.3;     // each rank's time between operations
  double jitter = 0;        // plus up to this much, uniformly
  double read = 0.2;        // the last arrival to everyone's finish, nobody asleep
  double wake = 50;         // a futex wake-up: the post to the sleeper running
  double hiccup = 100;      // a rank descheduled for this long ...
  double hiccup_rate = 1e-3;  // ... in this fraction of its operations
};

struct Outcome {
  double per_operation = 0;  // mean time per all-reduce
  double spin_per_wait = 0;  // mean core time spun per wait that was not instant
  double sleeps_per_operation = 0;
};

// Every rank posts, then waits for the last arrival; a rank whose budget
// runs out first sleeps and finishes `wake` after that arrival.
Outcome run_model(const Machine& m, const SpinBudget& policy, int operations, unsigned seed = 1) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<SpinBudget> budgets(static_cast<std::size_t>(m.ranks), policy);
  std::vector<double> finish(static_cast<std::size_t>(m.ranks), 0.0);
  std::vector<double> arrive(finish.size());
  double spun = 0;
  long waits = 0, sleeps = 0;
  for (int op = 0; op < operations; ++op) {
    for (std::size_t i = 0; i < arrive.size(); ++i) {
      arrive[i] = finish[i] + m.compute + m.jitter * uniform(random);
      if (uniform(random) < m.hiccup_rate) arrive[i] += m.hiccup;
    }
    const double last = *std::max_element(arrive.begin(), arrive.end());
    for (std::size_t i = 0; i < arrive.size(); ++i) {
      SpinBudget& budget = budgets[i];
      const double gap = last - arrive[i];
      const double spin = static_cast<double>(budget.nanos()) / kMicros;
      if (gap == 0) {
        finish[i] = last + m.read;
        continue;
      }
      ++waits;
      if (gap <= spin) {
        finish[i] = last + m.read;
        spun += gap;
      } else {
        finish[i] = last + m.wake;
        spun += spin;
        ++sleeps;
        budget.record_wake(static_cast<std::int64_t>(m.wake * kMicros));
      }
    }
  }
  const double end = *std::max_element(finish.begin(), finish.end());
  return {end / operations, waits ? spun / static_cast<double>(waits) : 0.0,
          static_cast<double>(sleeps) / operations};
}

// Never sleeps: the best any spin budget can do, at the cost of a core.
SpinBudget spin_forever() { return SpinBudget::fixed(std::numeric_limits<std::int64_t>::max() / 4); }

constexpr int kOperations = 20000;

TEST(WaitPolicyModel, AFixedSpinShorterThanAWakeUpFallsOffTheCliff) {
  // The model must show the effect, or the tests below prove nothing.
  const Machine m;
  const Outcome ideal = run_model(m, spin_forever(), kOperations);
  const Outcome fixed = run_model(m, SpinBudget::fixed(20 * kMicros), kOperations);
  EXPECT_GT(fixed.per_operation, 10 * ideal.per_operation)
      << "fixed 20 us: " << fixed.per_operation << " us per operation, never sleeping: " << ideal.per_operation;
  EXPECT_GT(fixed.sleeps_per_operation, 1.0);
}

TEST(WaitPolicyModel, TheAdaptiveBudgetStaysNearNeverSleeping) {
  for (const int ranks : {2, 4, 8, 16}) {
    for (const double wake : {20.0, 50.0, 200.0}) {
      Machine m;
      m.ranks = ranks;
      m.wake = wake;
      const Outcome ideal = run_model(m, spin_forever(), kOperations);
      const Outcome adaptive = run_model(m, SpinBudget::adaptive(), kOperations);
      EXPECT_LE(adaptive.per_operation, 1.25 * ideal.per_operation + 1.0)
          << ranks << " ranks, wake-up " << wake << " us: adaptive " << adaptive.per_operation
          << " us per operation, never sleeping " << ideal.per_operation;
    }
  }
}

TEST(WaitPolicyModel, ComputingRanksSpinNoLongerThanTwoWakeUps) {
  // A training step: ranks reach each all-reduce milliseconds apart, so
  // most waits end in a sleep whatever the budget; each spins at most the
  // budget, twice the wake-up, before it does.
  Machine m;
  m.compute = 2000;
  m.jitter = 2000;
  const Outcome fixed = run_model(m, SpinBudget::fixed(20 * kMicros), 5000);
  const Outcome adaptive = run_model(m, SpinBudget::adaptive(), 5000);
  EXPECT_LE(adaptive.spin_per_wait, 2 * m.wake) << "adaptive spins " << adaptive.spin_per_wait << " us per wait";
  EXPECT_LE(adaptive.per_operation, fixed.per_operation)
      << "adaptive " << adaptive.per_operation << " us per operation, fixed 20 us " << fixed.per_operation;
}

}  // namespace
}  // namespace lockstep::shm
