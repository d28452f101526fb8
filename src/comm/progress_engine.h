// The queue and progress thread behind every ProcessGroup. Operations are
// numbered (sequence numbers) and run one at a time in submission order,
// which is what makes the cross-rank order of collectives well defined.
//
// Small operations run inline: when the group is idle (nothing queued or
// running) and the operation is at most `inline_max_bytes`, the issuing
// thread runs it itself before returning its (finished) Work. That saves
// two thread hand-offs (several microseconds) on the latency-bound path;
// large operations always go to the progress thread, so they overlap with
// the caller's work, and so do operations on CUDA memory, whatever their
// size (the caller's stream orders them; the host does not wait).
//
// Failure policy: the first operation that fails aborts the engine; every
// queued and later operation completes at once with that same error, so no
// rank waits on a collective its group can no longer finish.
//
// Thread-safety: submit() may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/backend.h"
#include "diag/flight_recorder.h"
#include "diag/tracer.h"
#include "lockstep/process_group.h"

namespace lockstep::detail {

class ProgressEngine {
 public:
  using Task = std::function<void(const OpContext&)>;
  // Called once, with the first failure and its operation; returns the
  // error to report (e.g. the same error with more context).
  using AbortHook = std::function<std::exception_ptr(std::exception_ptr, std::uint64_t seq, const OpInfo&)>;

  // `recorder` and `tracer` (may be null) observe every operation. Times
  // and operation deadlines are read on `clock` (the group's Os; it must
  // outlive the engine).
  ProgressEngine(std::string self, Duration timeout, std::size_t inline_max_bytes, AbortHook on_abort = {},
                 diag::FlightRecorder* recorder = nullptr, diag::Tracer* tracer = nullptr, Os& clock = Os::real());
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  template <typename Fn>
  std::shared_ptr<Work> submit(const OpInfo& info, Fn&& fn) {
    // Issue times only need the kernel tick's resolution, unless a timeline
    // is being written; started and finished times of queued operations
    // are always precise.
    const auto now = precise_issue_ ? clock_.now() : clock_.coarse_now();
    const std::int64_t now_us = to_us(now);
    std::unique_lock lock(mutex_);
    // Never an operation on CUDA memory: it would wait here for the device
    // and the peers, a host synchronisation the stream contract exists to
    // avoid, on a thread that may be autograd's device thread, which every
    // rank of a process shares.
    const bool run_here = queue_.empty() && !running_ && !abort_error_ && !stopping_ &&
                          info.bytes() <= inline_max_bytes_ && !info.device.is_cuda();
    // An operation run here starts as it is issued.
    auto work = std::make_shared<Work>(next_seq_++, info, now_us, run_here ? now_us : 0);
    if (recorder_) recorder_->issued(work->seq(), info, now_us, /*started=*/run_here);
    if (abort_error_ || stopping_) {
      lock.unlock();
      if (recorder_) recorder_->finished(work->seq(), false, work->issued_us());
      work->complete(refusal(*work), work->issued_us());
      return work;
    }
    if (run_here) {
      running_ = true;
      lock.unlock();
      execute(*work, fn, now, /*on_issuing_thread=*/true);
      return work;
    }
    queue_.push_back({work, Task(std::forward<Fn>(fn))});
    lock.unlock();
    wake_.notify_one();
    return work;
  }

  // Runs what is queued, then stops the thread. Idempotent.
  void drain_and_stop();

  // Aborts from outside (the watchdog, another rank's failure): queued and
  // later operations fail with `error`; a running one is cancelled (it ends
  // where its backend next looks, and fails with `error` too).
  void abort(std::exception_ptr error);

  bool aborted() const;
  std::uint64_t issued() const;

 private:
  struct Item {
    std::shared_ptr<Work> work;
    Task task;
  };

  // Runs one operation on this thread (running_ is already set), completes
  // its Work and releases the engine.
  // `on_issuing_thread`: run inline; the Work and the recorder already
  // know it started.
  template <typename Fn>
  void execute(Work& work, Fn& fn, Clock::time_point started, bool on_issuing_thread = false) {
    const OpContext op = context_for(work, started);
    if (!on_issuing_thread) {
      work.mark_started(to_us(started));
      if (recorder_) recorder_->started(work.seq(), to_us(started));
    }
    std::exception_ptr error;
    try {
      fn(op);
    } catch (...) {
      error = std::current_exception();
    }
    finish(work, error, on_issuing_thread && !precise_issue_ ? clock_.coarse_now() : clock_.now());
  }

  OpContext context_for(const Work& work, Clock::time_point started) const;
  std::exception_ptr refusal(const Work& work) const;
  void finish(Work& work, std::exception_ptr error, Clock::time_point finished);
  void run();

  const std::string self_;
  const Duration timeout_;
  const std::size_t inline_max_bytes_;
  const AbortHook on_abort_;
  diag::FlightRecorder* const recorder_;
  diag::Tracer* const tracer_;
  const bool precise_issue_;  // a timeline is being written
  Os& clock_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Item> queue_;
  std::uint64_t next_seq_ = 0;
  bool running_ = false;  // an operation is executing (on some thread)
  bool stopping_ = false;
  std::exception_ptr abort_error_;
  std::atomic<bool> cancel_{false};  // set with abort_error_; running operations watch it (OpContext::cancel)
  std::thread thread_;
};

}  // namespace lockstep::detail
