// Work: the state of one asynchronous operation, completed by the group's
// progress thread and observed by any thread. A mutex and a condition
// variable guard the state. Thread-safe.
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "common/clock.h"
#include "lockstep/process_group.h"

namespace lockstep {

struct Work::State {
  mutable std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::exception_ptr error;
  std::int64_t started_us = 0;
  std::int64_t finished_us = 0;
  std::vector<std::function<void(const Work&)>> callbacks;
};

Work::Work(std::uint64_t seq, Collective collective, std::string description)
    : seq_(seq),
      collective_(collective),
      description_(std::move(description)),
      issued_us_(now_us()),
      state_(std::make_shared<State>()) {}

void Work::wait(Duration timeout) {
  std::unique_lock lock(state_->mutex);
  if (timeout == Duration::max()) {
    state_->finished.wait(lock, [&] { return state_->done; });
  } else if (!state_->finished.wait_for(lock, timeout, [&] { return state_->done; })) {
    throw TimeoutError(fmt::format("{} still running after Work::wait({} ms); it goes on until its own deadline",
                                   description_, timeout.count()));
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Work::done() const {
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

std::exception_ptr Work::error() const {
  std::lock_guard lock(state_->mutex);
  return state_->error;
}

void Work::on_complete(std::function<void(const Work&)> callback) {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
  }
  callback(*this);
}

std::int64_t Work::started_us() const {
  std::lock_guard lock(state_->mutex);
  return state_->started_us;
}

std::int64_t Work::finished_us() const {
  std::lock_guard lock(state_->mutex);
  return state_->finished_us;
}

void Work::mark_started() {
  std::lock_guard lock(state_->mutex);
  state_->started_us = now_us();
}

void Work::complete(std::exception_ptr error) {
  std::vector<std::function<void(const Work&)>> callbacks;
  {
    std::lock_guard lock(state_->mutex);
    state_->error = std::move(error);
    state_->finished_us = now_us();
    if (state_->started_us == 0) state_->started_us = state_->finished_us;
    callbacks.swap(state_->callbacks);
  }
  // Callbacks run before the Work counts as done, so whoever waits sees
  // their effects; ones registered meanwhile are picked up by the loop.
  for (;;) {
    for (auto& cb : callbacks) {
      try {
        cb(*this);
      } catch (const std::exception& e) {
        // A callback has nowhere to send its error; say so rather than lose it.
        std::fputs(fmt::format("lockstep: a completion callback of {} threw: {}\n", description_, e.what()).c_str(),
                   stderr);
      }
    }
    std::lock_guard lock(state_->mutex);
    callbacks.clear();
    callbacks.swap(state_->callbacks);
    if (callbacks.empty()) {
      state_->done = true;
      break;
    }
  }
  state_->finished.notify_all();
}

}  // namespace lockstep
