// What the trainers that survive a death in place share (ResilientTrainer,
// ShardedResilientTrainer): the seed of a shard's computation, the rank
// a failure names as lost, and a collective whose failure is a loss to
// recover from. Free functions, thread-safe, and the throttled look for
// replacements (one per trainer, its first rank's).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::torch::survival {

// A generator seed of its own for each (seed, step, shard): a shard's
// dropout draws the same numbers whichever rank computes it.
std::uint64_t shard_seed(std::uint64_t seed, std::uint64_t step, int shard);

// The rank of `group` a failure names as lost (a PeerError's peer), if
// any; none for a timeout. A PeerError naming this rank itself means it
// was left out: rethrown, it must stop.
std::vector<int> named_lost(const std::exception_ptr& failure, const ProcessGroup& group);

// Runs `collective`; where a rank was lost meanwhile (PeerError,
// TimeoutError), gives the failure to `recover` instead and returns
// false. Other errors go through.
bool survived(const std::function<void()>& collective,
              const std::function<void(const std::exception_ptr&)>& recover);

// The first rank's look in the store for replacements waiting to join, at
// most every 50 ms: a counter's read, off the step's critical path for any
// step this short. Not thread-safe (the trainer's thread).
class ReplacementLook {
 public:
  // The world ranks waiting now; nullopt between looks and while the
  // store does not answer (looked at again later).
  std::optional<std::vector<int>> waiting(ProcessGroup& group);

 private:
  std::chrono::steady_clock::time_point next_{};
};

}  // namespace lockstep::torch::survival
