// Which rank holds which logical shard of a job that goes on after losing
// ranks (docs/faults.md, "Logical shards"). A job starts with `shards`
// shards, shard s at home on world rank s % world_size (the rank that holds
// it in a clean run). After a loss, a shard stays with its home rank while
// that rank is a member; the shards whose home is gone are dealt, in
// ascending order, to the members in turn, lowest world rank first. Every
// rank computes the same map from the same members.
// Pure; thread-safe.
#pragma once

#include <vector>

#include "comm/shard_map.h"  // shards_held: the shards a member holds

namespace lockstep {

// holder[s]: the index, in `members` (the world ranks of the group's ranks,
// ascending as shrink keeps them), of the member that holds shard s.
std::vector<int> assign_shards(int shards, int world_size, const std::vector<int>& members);

}  // namespace lockstep
