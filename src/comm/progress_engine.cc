// ProgressEngine; see progress_engine.h.
#include "comm/progress_engine.h"

#include <fmt/format.h>

#include "common/format.h"

namespace lockstep::detail {

ProgressEngine::ProgressEngine(std::string self, Duration timeout, AbortHook on_abort)
    : self_(std::move(self)), timeout_(timeout), on_abort_(std::move(on_abort)), thread_([this] { run(); }) {}

ProgressEngine::~ProgressEngine() { drain_and_stop(); }

std::shared_ptr<Work> ProgressEngine::submit(Collective collective, const std::string& details, Task task) {
  std::unique_lock lock(mutex_);
  const std::uint64_t seq = next_seq_++;
  auto work = std::make_shared<Work>(seq, collective,
                                     details.empty() ? fmt::format("{} #{}", collective, seq)
                                                     : fmt::format("{} #{} ({})", collective, seq, details));
  if (abort_error_ || stopping_) {
    const std::exception_ptr error =
        abort_error_ ? abort_error_
                     : std::make_exception_ptr(Error(fmt::format("{}: {} issued while the group is being destroyed",
                                                                 self_, work->description())));
    lock.unlock();
    work->complete(error);
    return work;
  }
  queue_.push_back({work, std::move(task)});
  lock.unlock();
  wake_.notify_one();
  return work;
}

void ProgressEngine::drain_and_stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool ProgressEngine::aborted() const {
  std::lock_guard lock(mutex_);
  return abort_error_ != nullptr;
}

std::uint64_t ProgressEngine::issued() const {
  std::lock_guard lock(mutex_);
  return next_seq_;
}

void ProgressEngine::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      if (abort_error_) {
        lock.unlock();
        item.work->complete(abort_error_);
        continue;
      }
    }
    OpContext op;
    op.seq = item.work->seq();
    op.collective = item.work->collective();
    op.timeout = timeout_;
    op.deadline = Deadline::after(timeout_);
    op.description = item.work->description();
    item.work->mark_started();
    std::exception_ptr error;
    try {
      item.task(op);
    } catch (...) {
      error = std::current_exception();
    }
    finish(item, error);
  }
}

void ProgressEngine::finish(Item& item, std::exception_ptr error) {
  if (error) {
    // Only this thread sets abort_error_, so the check needs no lock.
    if (on_abort_ && !aborted()) error = on_abort_(error);
    std::lock_guard lock(mutex_);
    if (!abort_error_) abort_error_ = error;
  }
  item.work->complete(error);
}

}  // namespace lockstep::detail
