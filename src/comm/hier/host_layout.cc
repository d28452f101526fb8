// HostLayout; see host_layout.h.
#include "comm/hier/host_layout.h"

#include <algorithm>

namespace lockstep {

HostLayout::HostLayout(const std::vector<std::string>& host_ids, int rank)
    : host_of(host_ids.size(), 0), local_rank_of(host_ids.size(), 0) {
  std::vector<std::string> names;  // host index -> identity
  std::vector<int> ranks_on;       // host index -> ranks seen so far
  for (std::size_t r = 0; r < host_ids.size(); ++r) {
    const auto it = std::find(names.begin(), names.end(), host_ids[r]);
    const auto h = static_cast<std::size_t>(it - names.begin());
    if (it == names.end()) {
      names.push_back(host_ids[r]);
      ranks_on.push_back(0);
    }
    host_of[r] = static_cast<int>(h);
    local_rank_of[r] = ranks_on[h]++;
  }
  hosts = static_cast<int>(names.size());
  uniform = std::all_of(ranks_on.begin(), ranks_on.end(), [&](int n) { return n == ranks_on.front(); });
  const auto me = static_cast<std::size_t>(rank);
  host = host_of[me];
  local_rank = local_rank_of[me];
  for (std::size_t r = 0; r < host_ids.size(); ++r) {
    if (host_of[r] == host) local_ranks.push_back(static_cast<int>(r));
    if (local_rank_of[r] == local_rank) across.push_back(static_cast<int>(r));
  }
  if (!uniform) return;
  for (int l = 0; l < local_size(); ++l)
    for (std::size_t r = 0; r < host_ids.size(); ++r)
      if (local_rank_of[r] == l) by_local_rank.push_back(static_cast<int>(r));
}

}  // namespace lockstep
