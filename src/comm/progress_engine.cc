// ProgressEngine; see progress_engine.h.
#include "comm/progress_engine.h"

#include <fmt/format.h>

namespace lockstep::detail {

ProgressEngine::ProgressEngine(std::string self, Duration timeout, std::size_t inline_max_bytes, AbortHook on_abort,
                               diag::FlightRecorder* recorder, diag::Tracer* tracer, Os& clock)
    : self_(std::move(self)),
      timeout_(timeout),
      inline_max_bytes_(inline_max_bytes),
      on_abort_(std::move(on_abort)),
      recorder_(recorder),
      tracer_(tracer),
      precise_issue_(tracer != nullptr && tracer->enabled()),
      clock_(clock),
      thread_([this] { run(); }) {}

ProgressEngine::~ProgressEngine() { drain_and_stop(); }

void ProgressEngine::drain_and_stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ProgressEngine::abort(std::exception_ptr error) {
  std::deque<Item> dropped;
  {
    std::lock_guard lock(mutex_);
    if (!abort_error_) abort_error_ = error;
    cancel_.store(true, std::memory_order_relaxed);
    dropped.swap(queue_);
  }
  for (auto& item : dropped) {
    const std::int64_t now = to_us(clock_.now());
    if (recorder_) recorder_->finished(item.work->seq(), false, now);
    item.work->complete(abort_error_, now);
  }
}

bool ProgressEngine::aborted() const {
  std::lock_guard lock(mutex_);
  return abort_error_ != nullptr;
}

std::uint64_t ProgressEngine::issued() const {
  std::lock_guard lock(mutex_);
  return next_seq_;
}

OpContext ProgressEngine::context_for(const Work& work, Clock::time_point started) const {
  OpContext op;
  op.seq = work.seq();
  op.info = work.info();
  op.timeout = timeout_;
  op.deadline = Deadline::starting_at(started, timeout_);
  op.clock = &clock_;
  op.cancel = &cancel_;
  return op;
}

std::exception_ptr ProgressEngine::refusal(const Work& work) const {
  if (abort_error_) return abort_error_;
  return std::make_exception_ptr(
      Error(fmt::format("{}: {} issued while the group is being destroyed", self_, work.description())));
}

// How often outstanding operations are polled while nothing else is to be
// done: a device collective takes tens of microseconds at the least.
constexpr auto kPollInterval = std::chrono::microseconds(50);

void ProgressEngine::run() {
  std::unique_lock lock(mutex_);
  const auto startable = [&] { return !queue_.empty() && !running_; };
  for (;;) {
    if (!outstanding_.empty()) {
      wake_.wait_for(lock, kPollInterval, startable);
      lock.unlock();
      poll_outstanding();
      lock.lock();
      if (!startable()) continue;
    } else {
      wake_.wait(lock, [&] { return (stopping_ && !running_) || startable(); });
      if (queue_.empty()) return;  // stopping and drained
    }
    Item item = std::move(queue_.front());
    queue_.pop_front();
    if (abort_error_) {
      lock.unlock();
      const std::int64_t now = to_us(clock_.now());
      if (recorder_) recorder_->finished(item.work->seq(), false, now);
      item.work->complete(abort_error_, now);
      lock.lock();
      continue;
    }
    running_ = true;
    lock.unlock();
    execute(item.work, item.task, clock_.now());
    lock.lock();
  }
}

namespace {

bool is_cancellation(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const OperationCancelled&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::exception_ptr ProgressEngine::conclude(const Work& work, std::exception_ptr error, Clock::time_point finished_at) {
  if (error && on_abort_ && !aborted()) error = on_abort_(error, work.seq(), work.info());
  const std::int64_t finished = to_us(finished_at);
  if (recorder_) recorder_->finished(work.seq(), !error, finished);
  if (tracer_ && tracer_->enabled()) {
    const std::string label = recorder_ ? recorder_->label_of(work.seq()) : std::string();
    tracer_->event(work.description() + (label.empty() ? "" : " [" + label + "]"), "collectives", work.started_us(),
                   finished);
  }
  std::lock_guard lock(mutex_);
  if (error && !abort_error_) abort_error_ = error;
  if (error && abort_error_ && is_cancellation(error)) error = abort_error_;
  return error;
}

void ProgressEngine::finish(Work& work, std::exception_ptr error, Clock::time_point finished_at) {
  error = conclude(work, error, finished_at);
  bool queued = false;
  {
    std::lock_guard lock(mutex_);
    running_ = false;
    queued = !queue_.empty() || stopping_;
  }
  // Release the engine before completing: a completion callback may issue
  // the next operation. Wake the progress thread only if it has work: an
  // idle wake-up costs a context switch on the caller's core.
  if (queued) wake_.notify_one();
  work.complete(error, to_us(finished_at));
}

bool ProgressEngine::leave_outstanding(const std::shared_ptr<Work>& work, const OpContext& op,
                                       std::unique_ptr<PendingCompletion> pending, std::exception_ptr error,
                                       Clock::time_point finished) {
  std::lock_guard lock(mutex_);
  // A failed call completes now (its error aborts the engine); a finished
  // one only if nothing before it is outstanding.
  if (error) pending.reset();
  if (!pending && outstanding_.empty()) return false;
  outstanding_.push_back({work, op, std::move(pending), error, finished});
  running_ = false;  // the progress thread, the caller, takes the next operation itself
  return true;
}

void ProgressEngine::poll_outstanding() {
  for (;;) {
    Outstanding* front = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (outstanding_.empty()) return;
      front = &outstanding_.front();  // only this thread pops or pushes
    }
    if (front->pending) {
      bool done = false;
      try {
        done = front->pending->poll(front->op);
      } catch (...) {
        front->error = std::current_exception();
        done = true;
      }
      if (!done) {
        if (aborted()) {
          std::lock_guard lock(mutex_);
          front->error = abort_error_;
        } else if (front->op.expired()) {
          front->error = std::make_exception_ptr(TimeoutError(fmt::format(
              "{}: {} was not done on the device {} ms after it started (LOCKSTEP_TIMEOUT); a peer may be stuck, or "
              "have died before issuing it",
              self_, front->op.description(),
              std::chrono::duration_cast<std::chrono::milliseconds>(front->op.timeout).count())));
        } else {
          return;
        }
      }
      front->finished = clock_.now();
    }
    Outstanding item;
    {
      std::lock_guard lock(mutex_);
      item = std::move(outstanding_.front());
      outstanding_.pop_front();
    }
    const std::exception_ptr error = conclude(*item.work, item.error, item.finished);
    item.work->complete(error, to_us(item.finished));
  }
}

}  // namespace lockstep::detail
