// The queue and progress thread behind every ProcessGroup. Operations are
// numbered (sequence numbers) and run one at a time in submission order,
// which is what makes the cross-rank order of collectives well defined.
//
// Failure policy: the first operation that fails aborts the engine; every
// queued and later operation completes at once with that same error, so no
// rank waits on a collective its group can no longer finish.
//
// Thread-safety: submit() may be called from any thread; tasks run on the
// engine's own thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/backend.h"
#include "lockstep/process_group.h"

namespace lockstep::detail {

class ProgressEngine {
 public:
  using Task = std::function<void(const OpContext&)>;
  // Called once, on the progress thread, with the first failure; returns the
  // error to report (e.g. the same error with more context).
  using AbortHook = std::function<std::exception_ptr(std::exception_ptr)>;

  ProgressEngine(std::string self, Duration timeout, AbortHook on_abort = {});
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // `details` completes the description: "allreduce #12 (<details>)".
  std::shared_ptr<Work> submit(Collective collective, const std::string& details, Task task);

  // Runs what is queued, then stops the thread. Idempotent.
  void drain_and_stop();

  bool aborted() const;
  std::uint64_t issued() const;

 private:
  struct Item {
    std::shared_ptr<Work> work;
    Task task;
  };
  void run();
  void finish(Item& item, std::exception_ptr error);

  const std::string self_;
  const Duration timeout_;
  const AbortHook on_abort_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Item> queue_;
  std::uint64_t next_seq_ = 0;
  bool stopping_ = false;
  std::exception_ptr abort_error_;
  std::thread thread_;
};

}  // namespace lockstep::detail
