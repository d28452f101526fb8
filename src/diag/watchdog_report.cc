// Watchdog progress records and verdicts; see watchdog_report.h.
#include "diag/watchdog_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "diag/fingerprint.h"

namespace lockstep::diag {

std::string RankProgress::encode() const {
  return nlohmann::json{{"rank", rank}, {"issued", issued}, {"running", running}, {"last_completed", last_completed},
                        {"host", host}, {"pid", pid}}
      .dump();
}

std::optional<RankProgress> RankProgress::decode(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  RankProgress p;
  p.rank = j.value("rank", -1);
  p.issued = j.value("issued", std::uint64_t{0});
  p.running = j.value("running", "");
  p.last_completed = j.value("last_completed", "");
  p.host = j.value("host", "");
  p.pid = j.value("pid", 0);
  return p;
}

std::string verdict(std::uint64_t seq, const std::string& what, int reporter,
                    const std::vector<std::optional<RankProgress>>& all) {
  std::vector<int> behind, waiting, silent;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    if (!p)
      silent.push_back(r);
    else if (p->issued <= seq)
      behind.push_back(r);
    else
      waiting.push_back(r);
  }
  std::string out = fmt::format("watchdog (reported by rank {}): operation #{} ({}) did not complete.", reporter, seq, what);
  if (!behind.empty())
    out += fmt::format("\n  rank(s) {} never reached #{}: they are late, stuck outside lockstep, or issued fewer "
                       "collectives than the others", rank_list(behind), seq);
  if (!silent.empty())
    out += fmt::format("\n  rank(s) {} did not answer the watchdog: hung or dead (check their output)", rank_list(silent));
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    if (!p) continue;
    out += fmt::format("\n  rank {} (pid {} on {}): issued {} operation(s); {}; last completed: {}", r, p->pid, p->host,
                       p->issued, p->running.empty() ? "running nothing" : "running " + p->running,
                       p->last_completed.empty() ? "none" : p->last_completed);
  }
  return out;
}

}  // namespace lockstep::diag
