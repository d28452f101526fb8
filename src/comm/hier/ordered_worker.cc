#include "comm/hier/ordered_worker.h"

#include <chrono>

namespace lockstep {

OrderedWorker::OrderedWorker() : thread_([this] { run(); }) {}

OrderedWorker::~OrderedWorker() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  cancel_.store(true);
  changed_.notify_all();
  thread_.join();
}

std::size_t OrderedWorker::submit(std::function<void()> job) {
  std::lock_guard lock(mutex_);
  jobs_.push_back(std::move(job));
  changed_.notify_all();
  return jobs_.size() - 1;
}

void OrderedWorker::wait(std::size_t index, const std::atomic<bool>* owner_cancel) {
  std::unique_lock lock(mutex_);
  // The owner's flag is an atomic someone else sets without telling us:
  // look at it every few milliseconds, as the transports do.
  while (finished_ <= index) {  // jobs after a failure are skipped, so this ends
    if (owner_cancel != nullptr && owner_cancel->load(std::memory_order_relaxed)) cancel_.store(true);
    changed_.wait_for(lock, std::chrono::milliseconds(5));
  }
  if (failure_ && failed_job_ <= index) std::rethrow_exception(failure_);
}

void OrderedWorker::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return closing_ || finished_ < jobs_.size(); });
    if (finished_ == jobs_.size()) return;  // closing, nothing queued
    auto job = std::move(jobs_[finished_]);
    if (!failure_ && !closing_) {
      lock.unlock();
      try {
        job();
      } catch (...) {
        lock.lock();
        failure_ = std::current_exception();
        failed_job_ = finished_;
        lock.unlock();
      }
      lock.lock();
    }
    ++finished_;
    changed_.notify_all();
  }
}

}  // namespace lockstep
