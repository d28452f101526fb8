// Watchdog progress records and verdicts; see watchdog_report.h.
#include "diag/watchdog_report.h"

#include <map>

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

namespace {

// Ranks that all reached operation `seq` but run different operations there
// (a reduce to different roots, say: every root waits to receive and nobody
// sends, so no data path can see it) are a mismatch, not a slow rank.
std::string disagreement(std::uint64_t seq, const std::vector<std::optional<RankProgress>>& all) {
  const std::string number = fmt::format("#{} ", seq);
  std::map<std::string, std::vector<int>> ranks_running;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    if (!p || p->issued <= seq || p->running.find(number) == std::string::npos) continue;
    std::string what = p->running;
    for (const char* suffix : {" (queued)", " ["})
      if (const auto at = what.find(suffix); at != std::string::npos) what.resize(at);
    ranks_running[what].push_back(r);
  }
  if (ranks_running.size() < 2) return {};
  std::string out = fmt::format("\n  the ranks disagree on operation #{} (a mismatch, not a slow rank):", seq);
  for (const auto& [what, ranks] : ranks_running) out += fmt::format(" rank(s) {} run {};", rank_list(ranks), what);
  out += " every rank must issue the same collectives in the same order, with the same counts, dtypes and roots";
  return out;
}

// Who is behind, who is silent, any disagreement, and one line per rank.
std::string rank_details(std::uint64_t seq, const std::vector<std::optional<RankProgress>>& all) {
  std::vector<int> behind, silent;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    if (!p)
      silent.push_back(r);
    else if (p->issued <= seq)
      behind.push_back(r);
  }
  std::string out;
  if (!behind.empty())
    out += fmt::format("\n  rank(s) {} never reached #{}: they are late, stuck outside lockstep, or issued fewer "
                       "collectives than the others", rank_list(behind), seq);
  if (!silent.empty())
    out += fmt::format("\n  rank(s) {} did not answer the watchdog: hung or dead (check their output)", rank_list(silent));
  out += disagreement(seq, all);
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const auto& p = all[static_cast<std::size_t>(r)];
    if (!p) continue;
    out += fmt::format("\n  rank {} (pid {} on {}): issued {} operation(s); {}; last completed: {}", r, p->pid, p->host,
                       p->issued, p->running.empty() ? "running nothing" : "running " + p->running,
                       p->last_completed.empty() ? "none" : p->last_completed);
  }
  return out;
}

}  // namespace

std::string verdict(std::uint64_t seq, const std::string& what, int reporter,
                    const std::vector<std::optional<RankProgress>>& all) {
  return fmt::format("watchdog (reported by rank {}): operation #{} ({}) did not complete.", reporter, seq, what) +
         rank_details(seq, all);
}

std::string stall_report(std::uint64_t seq, const std::string& what, int reporter, double waited_s, double timeout_s,
                         const std::vector<std::optional<RankProgress>>& all) {
  return fmt::format("stall: operation #{} ({}) has waited {:.1f} s on rank {} (it fails at the {:.1f} s timeout); "
                     "the group so far:",
                     seq, what, waited_s, reporter, timeout_s) +
         rank_details(seq, all);
}

}  // namespace lockstep::diag
