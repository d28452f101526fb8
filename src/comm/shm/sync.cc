// Shared-memory waits; see sync.h.
#include "comm/shm/sync.h"

#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <ctime>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/clock.h"
#include "lockstep/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LOCKSTEP_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define LOCKSTEP_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define LOCKSTEP_CPU_RELAX() do {} while (0)
#endif

namespace lockstep::shm {
namespace {

// How long a wait yields (when ranks share cores) before sleeping.
constexpr std::int64_t kYieldNanos = 200'000;
// Sleep slices: how often a sleeping wait re-checks deadline and liveness.
constexpr long kSleepSliceNanos = 2'000'000;

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::uint32_t* futex_word(const std::atomic<std::uint64_t>& word) {
  // The low half of a little-endian 64-bit counter; it changes whenever the
  // counter does (by less than 2^32).
  static_assert(std::endian::native == std::endian::little);
  return reinterpret_cast<std::uint32_t*>(const_cast<std::atomic<std::uint64_t>*>(&word));
}

}  // namespace

void wake_all(const std::atomic<std::uint64_t>& word, WakeStamp& woke_at) {
  woke_at.store(now_ns(), std::memory_order_release);
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void Counter::post(std::uint64_t v) {
  value.store(v, std::memory_order_seq_cst);
  // seq_cst store then load pairs with the sleeper's increment-then-recheck:
  // either the sleeper sees the new value or we see the sleeper.
  if (sleepers.load(std::memory_order_seq_cst) != 0) wake_all(value, woke_at);
}

void Counter::bump() {
  value.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) wake_all(value, woke_at);
}

void Counter::post_stamped(std::uint64_t v, std::uint64_t what, std::uint64_t count) {
  stamp.posted.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  stamp.what.store(what, std::memory_order_relaxed);
  stamp.count.store(count, std::memory_order_relaxed);
  stamp.posted.store(v, std::memory_order_release);
  post(v);
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> Counter::stamp_of(std::uint64_t v) const {
  if (stamp.posted.load(std::memory_order_acquire) != v) return std::nullopt;
  const std::uint64_t what = stamp.what.load(std::memory_order_relaxed);
  const std::uint64_t count = stamp.count.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (stamp.posted.load(std::memory_order_relaxed) != v) return std::nullopt;  // rewritten meanwhile
  return std::pair{what, count};
}

PeerWatch::PeerWatch(const std::vector<pid_t>& pids, const std::vector<std::string>& pid_namespaces, int self)
    : pidfds_(pids.size()) {
  for (std::size_t q = 0; q < pids.size(); ++q) {
    if (static_cast<int>(q) == self || pids[q] == ::getpid()) continue;  // thread ranks share one process
    if (pid_namespaces[q] != pid_namespaces[static_cast<std::size_t>(self)]) continue;
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pids[q], 0));
    if (fd >= 0) pidfds_[q] = UniqueFd(fd);
  }
}

bool PeerWatch::alive(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= pidfds_.size()) return true;
  const UniqueFd& fd = pidfds_[static_cast<std::size_t>(peer)];
  if (!fd.valid()) return true;
  pollfd p{fd.fd(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;  // a pidfd turns readable when its process exits
}

bool PeerWatch::departed(int peer) const {
  if (peer < 0 || static_cast<std::size_t>(peer) >= departed_.size()) return false;
  const auto* flag = departed_[static_cast<std::size_t>(peer)];
  return flag != nullptr && flag->load(std::memory_order_acquire) != 0;
}

template <typename Reached, typename Check>
void Waiter::wait_phases(const std::atomic<std::uint64_t>& word, std::atomic<std::uint32_t>& sleepers,
                         const WakeStamp& woke_at, const Reached& reached, const Check& check) const {
  // A peer in lockstep arrives within a few hundred nanoseconds: look a
  // while before reading the clock.
  if (policy_ == SpinPolicy::spin) {
    for (int i = 0; i < 256; ++i) {
      if (reached()) return;
      LOCKSTEP_CPU_RELAX();
    }
  }
  const std::int64_t start = now_ns();
  if (policy_ == SpinPolicy::spin) {
    const std::int64_t spin_nanos = budget_.nanos();
    while (now_ns() - start < spin_nanos) {
      for (int i = 0; i < 64; ++i) {
        if (reached()) return;
        LOCKSTEP_CPU_RELAX();
      }
    }
  } else {
    while (now_ns() - start < kYieldNanos) {
      if (reached()) return;
      sched_yield();
    }
  }
  std::int64_t first_sleep = -1;  // when this wait first said it sleeps
  for (;;) {
    if (reached()) {
      // Woken by the post (not a slice's end before it): what it cost.
      const std::int64_t woken = woke_at.load(std::memory_order_acquire);
      if (first_sleep >= 0 && woken >= first_sleep) budget_.record_wake(now_ns() - woken);
      return;
    }
    check();
    if (first_sleep < 0) first_sleep = now_ns();
    // Announce the sleep, then look again: a poster either sees the
    // sleeper (and wakes it) or changed `word` before this load, and then
    // reached() sees its post or the futex refuses to sleep on a stale value.
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const std::uint64_t seen = word.load(std::memory_order_seq_cst);
    if (!reached()) {
      timespec slice{0, kSleepSliceNanos};
      ::syscall(SYS_futex, futex_word(word), FUTEX_WAIT, static_cast<std::uint32_t>(seen), &slice, nullptr, 0);
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void Waiter::throw_lost(int peer, const OpContext& op, const char* what) const {
  throw PeerError(fmt::format("{}: {}: lost rank {}: its process exited while this rank waited for it ({}) "
                              "without leaving the group; it crashed, was killed or exited without destroying "
                              "its process group. Check rank {}'s output for the cause",
                              self_, op.description(), peer, what, peer),
                  peer);
}

void Waiter::slow_wait(const std::atomic<std::uint64_t>& word, std::atomic<std::uint32_t>& sleepers,
                       const WakeStamp& woke_at, std::uint64_t target, int peer, const OpContext& op,
                       const char* what, const DivergenceCheck* divergence) const {
  const auto reached = [&] { return word.load(std::memory_order_acquire) >= target; };
  wait_phases(word, sleepers, woke_at, reached, [&] {
    if (divergence != nullptr) divergence->check(peer, op);
    if (op.cancelled()) throw OperationCancelled(fmt::format("{}: {} was cancelled", self_, op.description()));
    if (op.expired())  // on the group's clock; only once the spin budget is spent
      throw TimeoutError(fmt::format("{}: {} timed out after {:.1f} s waiting for rank {} ({}). Rank {} is stuck, "
                                     "slower than the timeout, or issued a different sequence of collectives; if it "
                                     "is only slow, raise LOCKSTEP_TIMEOUT",
                                     self_, op.description(), static_cast<double>(op.timeout.count()) / 1000.0, peer,
                                     what, peer),
                         peer);
    // A peer that left posted everything it ever will before saying so:
    // look once more, then it is a departure, told apart from a crash.
    if (peers_->departed(peer) && !reached())
      throw PeerError(fmt::format("{}: {}: rank {} left the group while this rank waited for it ({}): it destroyed "
                                  "its process group (a clean exit, not a crash) having issued fewer collectives than "
                                  "this rank, or after a failure of its own. Every rank must issue the same "
                                  "collectives (e.g. the same number of steps); check rank {}'s output",
                                  self_, op.description(), peer, what, peer),
                      peer);
    if (!peers_->alive(peer)) throw_lost(peer, op, what);
  });
}

void Waiter::wait_for_any(const Counter& doorbell, const std::vector<int>& peers, const std::function<bool()>& arrived,
                          const OpContext& op, const char* what) const {
  const std::string ranks = fmt::format("{}", fmt::join(peers, ", "));
  wait_phases(doorbell.value, doorbell.sleepers, doorbell.woke_at, arrived, [&] {
    if (op.cancelled()) throw OperationCancelled(fmt::format("{}: {} was cancelled", self_, op.description()));
    if (op.expired())
      throw TimeoutError(fmt::format("{}: {} timed out after {:.1f} s waiting for {} from any of ranks {}, none of "
                                     "which sent one. They are stuck, slower than the timeout, or issued a different "
                                     "sequence of operations (no send to this rank); if they are only slow, raise "
                                     "LOCKSTEP_TIMEOUT",
                                     self_, op.description(), static_cast<double>(op.timeout.count()) / 1000.0, what,
                                     ranks));
    bool all_left = true;
    for (int peer : peers) {
      if (peers_->departed(peer)) continue;
      all_left = false;
      if (!peers_->alive(peer)) throw_lost(peer, op, fmt::format("for {} from any rank", what).c_str());
    }
    // Peers that left posted everything they ever will before saying so:
    // look once more, then nobody is left to send.
    if (all_left && !arrived())
      throw PeerError(fmt::format("{}: {}: every rank that could send to this one ({}) left the group while it "
                                  "waited for {}: they destroyed their process groups (a clean exit, not a crash) "
                                  "having sent fewer messages than this rank receives, or after a failure of their "
                                  "own. Check their output",
                                  self_, op.description(), ranks, what));
  });
}

}  // namespace lockstep::shm
