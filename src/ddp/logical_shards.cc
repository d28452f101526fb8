// See logical_shards.h.
#include "ddp/logical_shards.h"

#include <algorithm>

#include "common/enforce.h"

namespace lockstep {

std::vector<int> assign_shards(int shards, int world_size, const std::vector<int>& members) {
  LOCKSTEP_CHECK_ARG(shards >= 1 && world_size >= 1 && !members.empty(),
                     "assign_shards: {} shards, a world of {} and {} members: each must be at least one", shards,
                     world_size, members.size());
  std::vector<int> holder(static_cast<std::size_t>(shards), -1);
  std::vector<int> orphans;
  for (int s = 0; s < shards; ++s) {
    const auto home = std::find(members.begin(), members.end(), s % world_size);
    if (home != members.end())
      holder[static_cast<std::size_t>(s)] = static_cast<int>(home - members.begin());
    else
      orphans.push_back(s);
  }
  // Members by world rank, lowest first, take the orphans in turn.
  std::vector<int> by_world_rank(members.size());
  for (std::size_t i = 0; i < members.size(); ++i) by_world_rank[i] = static_cast<int>(i);
  std::sort(by_world_rank.begin(), by_world_rank.end(),
            [&](int a, int b) { return members[static_cast<std::size_t>(a)] < members[static_cast<std::size_t>(b)]; });
  for (std::size_t k = 0; k < orphans.size(); ++k)
    holder[static_cast<std::size_t>(orphans[k])] = by_world_rank[k % by_world_rank.size()];
  return holder;
}

}  // namespace lockstep
