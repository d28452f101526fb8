// Collective fingerprints; see fingerprint.h.
#include "diag/fingerprint.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

namespace lockstep::diag {

Fingerprint fingerprint(const OpInfo& info, std::uint64_t number) {
  Fingerprint f;
  f.collective = static_cast<std::uint8_t>(info.collective);
  f.dtype = static_cast<std::uint8_t>(info.dtype);
  const bool reduces = info.collective == Collective::allreduce || info.collective == Collective::reduce ||
                       info.collective == Collective::reduce_scatter;
  f.op = reduces ? static_cast<std::uint8_t>(info.op) : 0;
  const bool rooted = info.collective == Collective::broadcast || info.collective == Collective::reduce ||
                      info.collective == Collective::gather || info.collective == Collective::scatter;
  f.root = rooted ? info.peer : -1;
  // An all_to_all with per-rank counts has a different total on each rank
  // by design; its counts are checked across ranks when it runs.
  const bool per_rank_total = info.collective == Collective::all_to_all && info.counts_digest != 0;
  f.count = per_rank_total ? 0 : info.count;
  f.number = number;
  return f;
}

std::string describe(const Fingerprint& f) {
  OpInfo info;
  info.collective = static_cast<Collective>(f.collective);
  info.dtype = static_cast<DType>(f.dtype);
  info.op = static_cast<ReduceOp>(f.op);
  info.count = f.count;
  info.peer = f.root;
  return lockstep::describe(info, f.number);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j >= i + 2 ? fmt::format("{}-{}", ranks[i], ranks[j]) : std::to_string(ranks[i]);
    if (j == i + 1) out += fmt::format(", {}", ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string compare_fingerprints(const std::vector<Fingerprint>& all) {
  std::vector<std::pair<Fingerprint, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == all[static_cast<std::size_t>(r)]; });
    if (it == groups.end())
      groups.push_back({all[static_cast<std::size_t>(r)], {r}});
    else
      it->second.push_back(r);
  }
  if (groups.size() <= 1) return {};
  // Largest group last: "rank 1 issued X while ranks 0, 2 issued Y".
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  std::string out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& [f, ranks] = groups[g];
    if (g > 0) out += g + 1 == groups.size() ? " while " : "; ";
    out += fmt::format("{} {} issued {}", ranks.size() == 1 ? "rank" : "ranks", rank_list(ranks), describe(f));
  }
  return out;
}

}  // namespace lockstep::diag
