// How long a shared-memory wait spins before it sleeps, learnt from what a
// sleep costs on this machine.
//
// A wait that gives up spinning sleeps on a futex, and waking it costs
// from a few microseconds (a core kept busy) to a hundred (an idle core in
// a virtual machine). A fixed spin shorter than that cost feeds on itself:
// the woken rank posts its next arrival late by the wake-up, so its peers
// out-wait their spin and sleep in turn, and a single hiccup turns into a
// wake-up in every operation (the 131 us 4-byte all-reduce at 16 ranks,
// docs/performance.md). A fixed spin long enough for any machine would take
// the core from a compute thread for as long, in every wait for a peer that
// is still computing.
//
// So the budget is twice the wake-up cost measured here (the poster stamps
// the time it wakes sleepers; the sleeper reads it when it runs again),
// kept within [floor, ceiling]. Spinning as long as sleeping would cost is
// the classic rule that never spends more than twice the best choice made
// in hindsight, and twice the wake-up outlasts the late arrival a wake-up
// causes, which breaks the cascade. tests/comm/wait_policy_model_test.cc
// runs this class in a model of ranks that hiccup and pay a wake-up per
// sleep, and of ranks that compute between operations.
//
// Not thread-safe: one per Waiter, used by the thread running operations.
#pragma once

#include <algorithm>
#include <cstdint>

namespace lockstep::shm {

class SpinBudget {
 public:
  // The default: 20 us (what 2-4 ranks on bare metal need) up to 1 ms.
  static constexpr std::int64_t kFloorNanos = 20'000;
  static constexpr std::int64_t kCeilingNanos = 1'000'000;

  static SpinBudget adaptive(std::int64_t floor_nanos = kFloorNanos, std::int64_t ceiling_nanos = kCeilingNanos) {
    return SpinBudget(floor_nanos, std::max(floor_nanos, ceiling_nanos));
  }
  // A budget that never moves (LOCKSTEP_SHM_SPIN_US set explicitly).
  static SpinBudget fixed(std::int64_t nanos) { return SpinBudget(nanos, nanos); }

  std::int64_t nanos() const { return nanos_; }
  bool is_fixed() const { return floor_ == ceiling_; }
  // The smoothed wake-up cost so far (0 before the first).
  std::int64_t wake_nanos() const { return wake_nanos_; }

  // A sleeping wait ran again `nanos` after its peer woke it.
  void record_wake(std::int64_t nanos) {
    if (is_fixed() || nanos < 0) return;
    // A moving average over the last few wake-ups: one slow wake-up (the
    // sleeper's core was busy) moves it a quarter of the way.
    wake_nanos_ = wake_nanos_ == 0 ? nanos : wake_nanos_ + (nanos - wake_nanos_) / 4;
    nanos_ = std::clamp(2 * wake_nanos_, floor_, ceiling_);
  }

 private:
  SpinBudget(std::int64_t floor_nanos, std::int64_t ceiling_nanos)
      : floor_(floor_nanos), ceiling_(ceiling_nanos), nanos_(floor_nanos) {}

  std::int64_t floor_;
  std::int64_t ceiling_;
  std::int64_t nanos_;
  std::int64_t wake_nanos_ = 0;
};

}  // namespace lockstep::shm
