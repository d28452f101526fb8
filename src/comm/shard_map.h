// A map of logical shards to the ranks that hold them (holder[s]: the rank
// of shard s), as ProcessGroup::reduce_shards takes it and the logical
// shards of a job that survives a rank's death deal it (ddp/
// logical_shards.h). Pure; thread-safe.
#pragma once

#include <cstddef>
#include <vector>

namespace lockstep {

// The shards `rank` holds, ascending.
inline std::vector<int> shards_held(const std::vector<int>& holder, int rank) {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(holder.size()); ++s)
    if (holder[static_cast<std::size_t>(s)] == rank) out.push_back(s);
  return out;
}

}  // namespace lockstep
