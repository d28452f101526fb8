// What the watchdog gathers when a collective times out: every rank's
// progress (how many operations it issued, what it is running, what it
// last completed), and the verdict composed from them, which names the
// ranks that never reached the operation. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::diag {

struct RankProgress {
  int rank = -1;
  std::uint64_t issued = 0;      // operations issued (the next one gets this number)
  std::string running;           // the operation executing now, "" if none
  std::string last_completed;    // "" if none
  std::string host;
  int pid = 0;

  std::string encode() const;
  static std::optional<RankProgress> decode(const std::string& text);
};

// `seq` timed out as `what` on `reporter`. `all[r]` is rank r's progress,
// or nullopt if it did not answer.
std::string verdict(std::uint64_t seq, const std::string& what, int reporter,
                    const std::vector<std::optional<RankProgress>>& all);

// The early warning before a timeout: `seq` (`what`) has run for `waited_s`
// seconds on `reporter`, out of a timeout of `timeout_s`; names the ranks
// that have not reached it and what every rank is doing.
std::string stall_report(std::uint64_t seq, const std::string& what, int reporter, double waited_s, double timeout_s,
                         const std::vector<std::optional<RankProgress>>& all);

}  // namespace lockstep::diag
