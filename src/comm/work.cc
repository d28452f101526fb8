// Work: the state of one asynchronous operation, completed by whichever
// thread ran it and observed by any thread. Its mutex and condition variable
// guard the state. Thread-safe.
#include <cstdio>

#include <fmt/format.h>

#include "comm/device_memory.h"
#include "common/clock.h"
#include "lockstep/process_group.h"

namespace lockstep {

Work::Work(std::uint64_t seq, const OpInfo& info, std::int64_t issued_us, std::int64_t started_us)
    : seq_(seq), info_(info), issued_us_(issued_us), started_us_(started_us) {}

void Work::wait(Duration timeout) {
  if (!done_.load(std::memory_order_acquire)) {
    std::unique_lock lock(mutex_);
    if (timeout == Duration::max()) {
      finished_.wait(lock, [&] { return done_.load(); });
    } else if (!finished_.wait_for(lock, timeout, [&] { return done_.load(); })) {
      throw TimeoutError(fmt::format("{} still running after Work::wait({} ms); it goes on until its own deadline",
                                     description(), timeout.count()));
    }
  }
  if (error_) std::rethrow_exception(error_);  // written before done_ was set
  if (stream_order_) stream_order_->caller_stream_waits();
}

void Work::synchronize(Duration timeout) {
  const auto deadline = Deadline::after(timeout);
  wait(timeout);
  if (stream_order_ && !stream_order_->host_waits(deadline.remaining()))
    throw TimeoutError(fmt::format("{}: its device work was still running after Work::synchronize({} ms)",
                                   description(), timeout.count()));
}

void Work::attach_stream_order(std::shared_ptr<detail::StreamOrder> order) { stream_order_ = std::move(order); }

void Work::attach_source(std::shared_ptr<const std::atomic<int>> source) { source_ = std::move(source); }

int Work::source_rank() const {
  if (info_.collective != Collective::recv) return -1;
  if (!source_) return info_.peer;
  // Written (release) once the message is in, before the Work completes, so
  // completion callbacks read it too; -1 until then and after a failure.
  return source_->load(std::memory_order_acquire);
}

bool Work::done() const { return done_.load(std::memory_order_acquire); }

std::exception_ptr Work::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void Work::on_complete(std::function<void(const Work&)> callback) {
  {
    std::lock_guard lock(mutex_);
    if (!done_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback(*this);
}

std::shared_ptr<Work> Work::then(std::function<void(const Work&)> continuation) {
  auto next = std::make_shared<Work>(seq_, info_, issued_us_);
  next->stream_order_ = stream_order_;
  next->source_ = source_;
  // Runs once this Work counts as done (unlike on_complete's callbacks), so
  // a waiter on `next` finds this one done too, as with c10d's futures.
  auto run = [next, continuation = std::move(continuation)](const Work& done) {
    std::exception_ptr error = done.error();
    if (!error) {
      try {
        continuation(done);
      } catch (...) {
        error = std::current_exception();
      }
    }
    next->mark_started(done.started_us());
    next->complete(error, now_us());
  };
  {
    std::lock_guard lock(mutex_);
    if (!done_.load(std::memory_order_relaxed)) {
      continuations_.push_back(std::move(run));
      return next;
    }
  }
  run(*this);
  return next;
}

std::int64_t Work::started_us() const {
  std::lock_guard lock(mutex_);
  return started_us_;
}

std::int64_t Work::finished_us() const {
  std::lock_guard lock(mutex_);
  return finished_us_;
}

void Work::mark_started(std::int64_t at_us) {
  std::lock_guard lock(mutex_);
  started_us_ = at_us;
}

void Work::complete(std::exception_ptr error, std::int64_t finished) {
  std::vector<std::function<void(const Work&)>> callbacks, continuations;
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    finished_us_ = finished;
    if (started_us_ == 0) started_us_ = finished_us_;
    if (callbacks_.empty()) {
      done_.store(true, std::memory_order_release);  // the common case: nothing to run first
      continuations.swap(continuations_);
    } else {
      callbacks.swap(callbacks_);
    }
  }
  if (callbacks.empty()) {
    finished_.notify_all();
    for (auto& next : continuations) next(*this);
    return;
  }
  // Callbacks run before the Work counts as done, so whoever waits sees
  // their effects; ones registered meanwhile are picked up by the loop.
  for (;;) {
    for (auto& cb : callbacks) {
      try {
        cb(*this);
      } catch (const std::exception& e) {
        // A callback has nowhere to send its error; say so rather than lose it.
        std::fputs(fmt::format("lockstep: a completion callback of {} threw: {}\n", description(), e.what()).c_str(),
                   stderr);
      }
    }
    std::lock_guard lock(mutex_);
    callbacks.clear();
    callbacks.swap(callbacks_);
    if (callbacks.empty()) {
      done_.store(true, std::memory_order_release);
      continuations.swap(continuations_);
      break;
    }
  }
  finished_.notify_all();
  for (auto& next : continuations) next(*this);
}

void wait_all(const std::vector<std::shared_ptr<Work>>& works) {
  std::exception_ptr first_failure;
  for (const auto& work : works) {
    try {
      work->wait();
    } catch (...) {
      if (!first_failure) first_failure = std::current_exception();
    }
  }
  if (first_failure) std::rethrow_exception(first_failure);
}

}  // namespace lockstep
