// What the trainers that survive a death in place share (ResilientTrainer,
// ShardedResilientTrainer): the seed of a shard's computation, the rank
// a failure names as lost, and a collective whose failure is a loss to
// recover from. Free functions, thread-safe.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
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

}  // namespace lockstep::torch::survival
