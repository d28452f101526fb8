// Heartbeat and SilenceWatch; see heartbeat.h.
#include "run/heartbeat.h"

#include "lockstep/error.h"

namespace lockstep::cli {

struct Heartbeat::State {
  std::shared_ptr<Store> store;
  Duration interval;
  std::mutex mutex;
  std::condition_variable changed;
  std::string key;     // guarded by mutex
  bool stop = false;   // guarded by mutex
  bool ended = false;  // guarded by mutex: the thread has returned
};

Heartbeat::Heartbeat(std::shared_ptr<Store> store, Duration interval) : state_(std::make_shared<State>()) {
  state_->store = std::move(store);
  state_->interval = interval;
  std::thread(run, state_).detach();
}

void Heartbeat::stop() {
  std::unique_lock lock(state_->mutex);
  state_->stop = true;
  state_->changed.notify_all();
  // A request to a stopped store may take its reply timeout; the launcher
  // does not wait that long to exit (the thread owns what it uses).
  state_->changed.wait_for(lock, std::chrono::seconds(1), [&] { return state_->ended; });
}

void Heartbeat::beat_on(const std::string& key) {
  std::lock_guard lock(state_->mutex);
  if (state_->key == key) return;
  state_->key = key;
  state_->changed.notify_all();
}

void Heartbeat::run(std::shared_ptr<State> state) {
  std::unique_lock lock(state->mutex);
  while (!state->stop) {
    const std::string key = state->key;
    if (!key.empty()) {
      lock.unlock();
      try {
        state->store->add(key, 1);
      } catch (const Error&) {
        // Tried again (reconnecting) at the next beat; if the store is gone
        // for good, the launcher's own requests find out and say so.
      }
      lock.lock();
    }
    // Until the next beat, or at once for a new key or a stop.
    state->changed.wait_for(lock, state->interval, [&] { return state->stop || state->key != key; });
  }
  state->store.reset();  // closes the connection
  state->ended = true;
  state->changed.notify_all();
}

std::optional<Silence> SilenceWatch::look(const std::map<int, std::int64_t>& counters, Clock::time_point now) {
  paused_ = Duration{};
  if (last_look_ && now - *last_look_ > limit_) {
    paused_ = std::chrono::duration_cast<Duration>(now - *last_look_);
    seen_.clear();  // every silence starts again from this look
  }
  last_look_ = now;
  for (auto it = seen_.begin(); it != seen_.end();) it = counters.count(it->first) ? std::next(it) : seen_.erase(it);
  std::optional<Silence> longest;
  for (const auto& [node, counter] : counters) {
    auto [it, added] = seen_.try_emplace(node, Seen{counter, now});
    Seen& seen = it->second;
    if (!added && seen.counter != counter) seen = Seen{counter, now};
    const Duration silent = std::chrono::duration_cast<Duration>(now - seen.since);
    if (silent > limit_ && (!longest || silent > longest->for_how_long)) longest = Silence{node, silent};
  }
  return longest;
}

void SilenceWatch::reset() {
  seen_.clear();
  last_look_.reset();
  paused_ = Duration{};
}

}  // namespace lockstep::cli
