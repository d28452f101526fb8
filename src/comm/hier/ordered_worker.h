// One thread that runs jobs in the order they were submitted: hier's
// pipelined allreduce hands it each piece's cross-host step, so the wire
// carries piece i while the calling thread runs the shared-memory steps of
// its neighbours. The transport it drives is then used by this thread only,
// one job at a time, as transports require.
//
// wait(i) returns when job i has finished (or was skipped); it rethrows the
// failure of a job up to i (after a failure, later jobs are skipped), and while it waits it passes the operation's cancel flag
// on to the jobs (which see only the worker's own flag). The destructor
// cancels what has not run and joins.
//
// Thread-safety: submit and wait from one thread (the owner); jobs run on
// the worker.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lockstep {

class OrderedWorker {
 public:
  OrderedWorker();
  ~OrderedWorker();
  OrderedWorker(const OrderedWorker&) = delete;
  OrderedWorker& operator=(const OrderedWorker&) = delete;

  // Set when the owner gives up (it failed, or its operation was
  // cancelled): jobs hand it to their transport as the cancel flag.
  const std::atomic<bool>* cancel_flag() const { return &cancel_; }

  // Queues a job; returns its index (0, 1, ...).
  std::size_t submit(std::function<void()> job);
  // Blocks until job `index` has run. `owner_cancel` (may be null) is
  // watched meanwhile and forwarded to cancel_flag().
  void wait(std::size_t index, const std::atomic<bool>* owner_cancel);
  // Stops the jobs still queued or running (they see cancel_flag()).
  void cancel() { cancel_.store(true); }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::function<void()>> jobs_;
  std::size_t finished_ = 0;      // jobs done (in order)
  std::exception_ptr failure_;    // the first job that threw; later jobs are skipped
  std::size_t failed_job_ = 0;    // its index
  bool closing_ = false;
  std::atomic<bool> cancel_{false};
  std::thread thread_;            // last: starts after the state above exists
};

}  // namespace lockstep
