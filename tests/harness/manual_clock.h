// A clock for tests of deadlines: an Os whose time stands still until the
// test moves it (advance), so a 60-second timeout expires the moment the
// test says, without waiting. Everything else is the real system call.
// Thread-safe: the offset is atomic; any thread may read or move it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "common/os.h"

namespace lockstep::testing {

class ManualClock final : public Os {
 public:
  // Starts at the real clock's present, so deadlines and times it stamps
  // look ordinary in messages.
  ManualClock() : start_(Clock::now()) {}

  void advance(Duration d) { offset_.fetch_add(d.count()); }

  Clock::time_point now() override { return start_ + Duration(offset_.load()); }
  Clock::time_point coarse_now() override { return now(); }
  // Sleeping on a clock that stands still would never end: it moves the
  // clock instead (as FaultyOs does).
  void sleep_for(Duration d) override { advance(d); }

 private:
  const Clock::time_point start_;
  std::atomic<Duration::rep> offset_{0};
};

// Moves `clock` on by `step` every few real milliseconds until `done()`
// says so or `limit` (real time) passes; returns done()'s last answer. For
// a deadline some other thread sets on the clock at a moment the test
// cannot know: every step after it was set takes it closer to expiring.
inline bool advance_until(ManualClock& clock, Duration step, const std::function<bool()>& done,
                          Duration limit = std::chrono::seconds(60)) {
  const auto give_up = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= give_up) return false;
    clock.advance(step);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace lockstep::testing
