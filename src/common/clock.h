// Monotonic time and deadlines. Every blocking wait in lockstep takes a
// Deadline, so nothing can wait forever. Values; thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>

#include "lockstep/types.h"

namespace lockstep {

using Clock = std::chrono::steady_clock;

inline double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Microseconds since the steady clock's epoch; a cheap, comparable timestamp.
inline std::int64_t to_us(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}
inline std::int64_t now_us() { return to_us(Clock::now()); }

// The same clock (CLOCK_MONOTONIC) at the resolution of a kernel tick (1-4
// ms), read in a few nanoseconds: for deadlines and diagnostics of
// operations too short to need more.
inline Clock::time_point coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                                       std::chrono::nanoseconds(ts.tv_nsec)));
}

class Deadline {
 public:
  static Deadline after(Duration d) { return starting_at(Clock::now(), d); }
  // `d` after `now` (a time the caller already read).
  static Deadline starting_at(Clock::time_point now, Duration d) {
    // Saturate instead of overflowing for "effectively forever" durations.
    if (d >= std::chrono::duration_cast<Duration>(Clock::time_point::max() - now)) return never();
    return Deadline(now + d);
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool is_never() const { return at_ == Clock::time_point::max(); }
  bool expired() const { return expired_at(Clock::now()); }
  // Whether it has passed at `now` (a time read on another clock of the
  // same epoch: a test's, see common/os.h).
  bool expired_at(Clock::time_point now) const { return !is_never() && now >= at_; }
  Clock::time_point at() const { return at_; }

  Duration remaining() const { return remaining_at(Clock::now()); }
  Duration remaining_at(Clock::time_point now) const {
    if (is_never()) return Duration::max();
    return std::max(Duration(0), std::chrono::duration_cast<Duration>(at_ - now));
  }

  // A timeout for poll(2): milliseconds left, rounded up, at most `cap` (-1: no cap).
  int poll_timeout_ms(int cap = -1) const { return poll_timeout_ms_at(Clock::now(), cap); }
  // The same, with the time read by the caller.
  int poll_timeout_ms_at(Clock::time_point now, int cap = -1) const {
    if (is_never()) return cap;
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(at_ - now).count();
    if (left <= 0) return 0;
    const std::int64_t ms = (left + 999) / 1000;
    const std::int64_t bounded = cap < 0 ? ms : std::min<std::int64_t>(ms, cap);
    return static_cast<int>(std::min<std::int64_t>(bounded, 1 << 30));
  }

  // The earlier of two deadlines.
  static Deadline earlier(Deadline a, Deadline b) { return a.at_ <= b.at_ ? a : b; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace lockstep
