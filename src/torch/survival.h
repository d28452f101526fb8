// What the trainers that survive a death in place share (ResilientTrainer,
// ShardedResilientTrainer): the seed of a shard's computation and the rank
// a failure names as lost. Free functions, thread-safe.
#pragma once

#include <cstdint>
#include <exception>
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

}  // namespace lockstep::torch::survival
