// Synchronisation between ranks through shared memory.
//
// A Counter is a monotonically increasing 64-bit value on its own cache
// line, written by one rank (release) and read by others (acquire). Waiting
// for a counter to reach a target spins briefly with `pause`, then (or at
// once when ranks outnumber cores) gives the core away: sched_yield for a
// while, then a futex sleep in short slices. Between slices every wait
// checks its deadline and whether the peer it waits for is still alive, so
// a dead peer is a PeerError within milliseconds and nothing waits forever.
//
// Counters live in shared memory; Waiter and PeerWatch are per process and
// used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "comm/shm/spin_budget.h"
#include "common/unique_fd.h"

namespace lockstep::shm {

// What operation a rank was running when it posted a counter: written
// (seqlock-style, `posted` last) before the post, read by the peers that
// waited for it, in the same cache line, so checking costs no extra miss.
struct OpStamp {
  std::atomic<std::uint64_t> posted{0};  // the counter value it belongs to; 0 while being written
  std::atomic<std::uint64_t> what{0};    // collective, dtype, op, root (op_stamp.h)
  std::atomic<std::uint64_t> count{0};
};

// When a poster last woke sleepers (CLOCK_MONOTONIC nanoseconds): a woken
// wait reads it to learn what a wake-up costs (spin_budget.h).
using WakeStamp = std::atomic<std::int64_t>;

struct alignas(64) Counter {
  std::atomic<std::uint64_t> value{0};
  mutable std::atomic<std::uint32_t> sleepers{0};
  OpStamp stamp;  // set by posts that carry one (post_stamped)
  WakeStamp woke_at{0};

  // Publishes a new value and wakes sleepers, if any.
  void post(std::uint64_t v);
  void add(std::uint64_t delta) { post(value.load(std::memory_order_relaxed) + delta); }
  // Adds one, atomically, and wakes sleepers: for a counter that several
  // ranks write (a doorbell), unlike post and add.
  void bump();
  // Records what this rank is running, then posts.
  void post_stamped(std::uint64_t v, std::uint64_t what, std::uint64_t count);
  // The stamp of post `v`, if the counter still holds it (a peer may have
  // moved on, up to the pipeline depth): {what, count}.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> stamp_of(std::uint64_t v) const;
};
static_assert(sizeof(Counter) == 64);

// Whether each peer process is still alive. Uses pidfds (no signals, no
// races with pid reuse); where the kernel or namespaces rule them out, the
// check is skipped and the deadline alone applies.
class PeerWatch {
 public:
  PeerWatch() = default;
  // pids[q] and pid namespace ids per rank; this process's own entry is ignored.
  PeerWatch(const std::vector<pid_t>& pids, const std::vector<std::string>& pid_namespaces, int self);
  bool alive(int peer) const;
  // departed_flags[q]: rank q's flag in its shared region (ControlBlock),
  // set when it destroys its group; null for this rank.
  void watch_departures(std::vector<const std::atomic<std::uint32_t>*> departed_flags) {
    departed_ = std::move(departed_flags);
  }
  // Whether the peer said it left (acquire: its earlier posts are visible).
  bool departed(int peer) const;

 private:
  std::vector<UniqueFd> pidfds_;
  std::vector<const std::atomic<std::uint32_t>*> departed_;
};

enum class SpinPolicy {
  spin,   // cores to spare: spin with pause, then sleep
  yield,  // ranks share cores: yield at once so the peer can run
};

// A test a wait runs while it sleeps, besides its own counter: whether the
// peer it waits for went down a path this rank did not take (another
// collective, whose size chose another protocol), and so will never post
// what this rank waits for. It throws MismatchError to end the wait; run
// only once the spin is over, so it costs nothing when peers are in step.
class DivergenceCheck {
 public:
  virtual void check(int peer, const OpContext& op) const = 0;

 protected:
  ~DivergenceCheck() = default;
};

class Waiter {
 public:
  // `budget`: how long a wait spins before it sleeps, under SpinPolicy::spin.
  Waiter(const PeerWatch& peers, SpinPolicy policy, std::string self, SpinBudget budget = SpinBudget::adaptive())
      : peers_(&peers), policy_(policy), self_(std::move(self)), budget_(budget) {}

  const SpinBudget& budget() const { return budget_; }

  // Waits until `counter` (owned by rank `peer`) is at least `target`.
  // `what` names the step for error messages ("inputs of round 4");
  // `divergence`, if any, is checked between sleeps.
  void wait_at_least(const Counter& counter, std::uint64_t target, int peer, const OpContext& op, const char* what,
                     const DivergenceCheck* divergence = nullptr) const {
    if (counter.value.load(std::memory_order_acquire) >= target) return;
    slow_wait(counter.value, counter.sleepers, counter.woke_at, target, peer, op, what, divergence);
  }
  // The same for a bare sequence word with its own sleeper count, whose
  // poster stamps `woke_at` when it wakes sleepers.
  void wait_at_least(const std::atomic<std::uint64_t>& word, std::atomic<std::uint32_t>& sleepers,
                     const WakeStamp& woke_at, std::uint64_t target, int peer, const OpContext& op, const char* what,
                     const DivergenceCheck* divergence = nullptr) const {
    if (word.load(std::memory_order_acquire) >= target) return;
    slow_wait(word, sleepers, woke_at, target, peer, op, what, divergence);
  }

  // Waits until `arrived()` is true: something any of `peers` may post,
  // each of them bumping `doorbell` after it did. Spins and sleeps as
  // wait_at_least, and fails as it does: at the deadline (TimeoutError
  // naming `peers`), on cancellation, and when a peer's process died; a
  // peer that left the group on purpose is only an error once every one
  // of `peers` has (PeerError). `what` names what is awaited ("a message").
  void wait_for_any(const Counter& doorbell, const std::vector<int>& peers, const std::function<bool()>& arrived,
                    const OpContext& op, const char* what) const;

 private:
  void slow_wait(const std::atomic<std::uint64_t>& word, std::atomic<std::uint32_t>& sleepers,
                 const WakeStamp& woke_at, std::uint64_t target, int peer, const OpContext& op, const char* what,
                 const DivergenceCheck* divergence) const;
  // The phases every wait goes through (spin, yield, sleep on `word` in
  // slices) until reached() is true; between sleeps, check() throws to end
  // the wait.
  template <typename Reached, typename Check>
  void wait_phases(const std::atomic<std::uint64_t>& word, std::atomic<std::uint32_t>& sleepers,
                   const WakeStamp& woke_at, const Reached& reached, const Check& check) const;
  // The PeerError for a peer whose process exited while this rank waited
  // (`what`: for what).
  [[noreturn]] void throw_lost(int peer, const OpContext& op, const char* what) const;

  const PeerWatch* peers_;
  SpinPolicy policy_;
  std::string self_;
  // Learns from every wait, so it changes in const waits; one thread waits at a time.
  mutable SpinBudget budget_;
};

// Stamps `woke_at` with the time, then wakes every thread sleeping on
// `word`'s futex (its low 32 bits).
void wake_all(const std::atomic<std::uint64_t>& word, WakeStamp& woke_at);

}  // namespace lockstep::shm
