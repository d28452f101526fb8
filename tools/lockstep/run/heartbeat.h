// Rendezvous heartbeats: how the launchers of an elastic job prove to each
// other, through the store, that they are alive (torchrun's keep-alive).
// Hosts' clocks differ, so no timestamp crosses hosts: each launcher adds 1
// to its own counter key every interval (Heartbeat, a thread, so it beats
// while the launcher waits anywhere; a frozen launcher stops beating), and
// an observer notes on its own monotonic clock when it last saw a counter
// change (SilenceWatch, a pure rule). A node is silent once its counter has
// not changed for interval x max_attempts.
// Heartbeat is thread-safe; SilenceWatch is not (one per observer).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/clock.h"
#include "lockstep/store.h"

namespace lockstep::cli {

// --rdzv-conf keep_alive_interval=S,keep_alive_max_attempt=N.
struct KeepAlive {
  Duration interval = std::chrono::seconds(5);
  int max_attempts = 3;
  // How long a counter may stay unchanged before its node counts as gone.
  Duration limit() const { return interval * max_attempts; }
  // This one with --rdzv-conf's values where given (above 0).
  KeepAlive overridden_by(double interval_seconds, int given_max_attempts) const {
    KeepAlive k = *this;
    if (interval_seconds > 0) k.interval = Duration(static_cast<std::int64_t>(interval_seconds * 1000));
    if (given_max_attempts > 0) k.max_attempts = given_max_attempts;
    return k;
  }
};

// Adds 1 to a key of the store now and then every `interval`, on a thread
// of its own with its own connection (`store`, a clone), so that it never
// waits behind the launcher's blocking requests. A failed request is
// tried again at the next beat (a node cut off from the store for longer
// than the limit is gone to the others); if the store is gone for good, the
// launcher's own requests fail too and say why.
class Heartbeat {
 public:
  Heartbeat(std::shared_ptr<Store> store, Duration interval);
  // Waits at most a moment for the thread (it may be inside a request to a
  // store that no longer answers); then leaves it to end by itself.
  ~Heartbeat() { stop(); }
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // From now on, beats on `key` (at once, then every interval); "" stops.
  void beat_on(const std::string& key);
  // Stops for good and closes the connection (as the destructor does), so
  // that the store's host does not count it among the readers it waits for.
  void stop();

 private:
  struct State;
  static void run(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive this
};

struct Silence {
  int node = -1;
  Duration for_how_long{};  // since this observer last saw its counter change
};

// The staleness rule, on the observer's clock only (times are injected).
// Each look passes the counters of the nodes to watch (by node rank); a
// node not passed is forgotten. A node is silent when its counter has not
// changed for longer than `limit` since it was first seen or last changed.
// If the observer itself did not look for longer than `limit` (it was
// stopped: SIGSTOP, a suspended host), it cannot tell who stopped beating,
// so every node's silence starts again from that look.
class SilenceWatch {
 public:
  explicit SilenceWatch(Duration limit) : limit_(limit) {}

  // The node silent the longest beyond the limit, if any.
  std::optional<Silence> look(const std::map<int, std::int64_t>& counters, Clock::time_point now);
  // Forgets every node (a new round).
  void reset();
  // Forgets one (lost, or finished): when it is watched again (a launcher
  // took its place), its silence starts from that look.
  void forget(int node) { seen_.erase(node); }
  // How long the observer was stopped before its latest look (0: it was not).
  Duration paused() const { return paused_; }
  Duration limit() const { return limit_; }

 private:
  struct Seen {
    std::int64_t counter = 0;
    Clock::time_point since{};
  };
  Duration limit_;
  std::map<int, Seen> seen_;
  std::optional<Clock::time_point> last_look_;
  Duration paused_{};
};

}  // namespace lockstep::cli
