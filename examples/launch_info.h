// What the examples that survive a rank's death read of their launch
// (lockstep run sets the variables): the launcher's round, which start of
// its rank this process is, and when it started, for the kills that tests
// schedule and for timing a replacement from its start.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <lockstep/error.h>

namespace examples {

// The launcher's round (LOCKSTEP_RESTART_COUNT; 0 for the first).
inline int launcher_round() {
  const char* round = std::getenv("LOCKSTEP_RESTART_COUNT");
  return round == nullptr ? 0 : std::atoi(round);
}

inline bool first_round() { return launcher_round() == 0; }

// Which start of this rank in the launcher's round this process is (0:
// the first; a replacement counts up).
inline int incarnation() {
  const char* value = std::getenv("LOCKSTEP_INCARNATION");
  return value == nullptr ? 0 : std::atoi(value);
}

inline double wall_clock_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// When this process started, by the wall clock: the kernel's start time
// (before libtorch is loaded, which a replacement's start spends most of
// its time on), at the clock tick's resolution.
inline double process_started_at() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after the command's name
  std::string field;
  unsigned long long ticks = 0;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) ticks = std::stoull(field);  // starttime: clock ticks after boot
  std::ifstream uptime("/proc/uptime");
  double up = 0;
  uptime >> up;
  return wall_clock_now() - up + static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// --kill-replacement R:I:K:PHASE: replacement I of world rank R kills
// itself K steps after the step it joined at, at PHASE (a phase of the
// program's own --kill).
struct ReplacementKill {
  int rank = -1;
  int incarnation = 0;
  std::uint64_t after = 0;
  std::string phase;
};

// The specs parsed; `check_phase` throws for a phase the program does not
// have.
inline std::vector<ReplacementKill> parse_replacement_kills(
    const std::vector<std::string>& specs, const std::function<void(const std::string& phase)>& check_phase) {
  std::vector<ReplacementKill> out;
  for (const std::string& spec : specs) {
    ReplacementKill k;
    std::istringstream in(spec);
    char c1 = 0, c2 = 0, c3 = 0;
    if (!(in >> k.rank >> c1 >> k.incarnation >> c2 >> k.after >> c3) || c1 != ':' || c2 != ':' || c3 != ':' ||
        !std::getline(in, k.phase) || k.rank < 0 || k.incarnation < 1)
      throw lockstep::InvalidArgument("--kill-replacement " + spec +
                                      ": use RANK:INCARNATION:STEPS:PHASE (INCARNATION >= 1)");
    check_phase(k.phase);
    out.push_back(k);
  }
  return out;
}

}  // namespace examples
