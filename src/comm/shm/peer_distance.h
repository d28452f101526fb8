// How far this rank's peers are, in cache terms: the time to load a line a
// peer has just written, sampled as the rounds go (shm_backend.cc), and
// whether that is far enough that slots should be written with streaming
// stores (handoff_copy.h).
//
// On the machine measured (docs/performance.md, "The ordinary path's slow
// mode": 2 vCPUs of an AMD EPYC host) such a load took 20-30 ns beyond the
// clock's own cost while the vCPUs shared a die and 110-120 ns while the
// host had put them on different ones (a line's round trip between the
// cores: 76-91 against 335-360 ns); a 96 MiB all-reduce through slots
// written with streaming stores took 1.7x as long in the first placement
// and a third in the second. The host changes the placement while a job
// runs (every few tens of seconds there), so the decision follows the
// latest samples.
//
// Used by one thread at a time (the group's).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace lockstep::shm {

class PeerDistance {
 public:
  // Loads slower than this (median of the window, the clock's own cost
  // taken off) count as far: between the two placements measured.
  static constexpr std::int64_t kFarNanos = 60;
  static constexpr std::size_t kWindow = 16;

  // Adds a sample; returns whether far() changed with it.
  bool record(std::int64_t nanos) {
    samples_[next_ % kWindow] = nanos;
    ++next_;
    const bool was = far_;
    if (next_ >= kWindow) far_ = median() > kFarNanos;
    return far_ != was;
  }
  // Until a full window is in, near: ordinary stores, the old behaviour.
  bool far() const { return far_; }
  std::int64_t median() const {
    std::array<std::int64_t, kWindow> sorted = samples_;
    const std::size_t n = std::min(next_, kWindow);
    std::nth_element(sorted.begin(), sorted.begin() + n / 2, sorted.begin() + n);
    return n == 0 ? 0 : sorted[n / 2];
  }

 private:
  std::array<std::int64_t, kWindow> samples_{};
  std::size_t next_ = 0;
  bool far_ = false;
};

}  // namespace lockstep::shm
