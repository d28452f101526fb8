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
// Deferred completion: a backend that queues an operation's work on a
// device stream (nccl) may leave a PendingCompletion (OpContext::defer)
// instead of waiting for the device. The engine then starts the next
// operation at once, so the device receives bucket after bucket with no
// host wait between them, and polls the outstanding ones from its thread,
// completing their Works in issue order (an operation that finishes at
// once behind an outstanding one waits its turn). Each is failed past its
// deadline or when the group aborts, if its poll has not said so first.
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
    const bool run_here = queue_.empty() && !running_ && outstanding_.empty() && !abort_error_ && !stopping_ &&
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
      execute(work, fn, now, /*on_issuing_thread=*/true);
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
  // An operation started but not completed: its work still on the device
  // (pending), or finished behind one that is (pending null; its error and
  // end time kept).
  struct Outstanding {
    std::shared_ptr<Work> work;
    OpContext op;
    std::unique_ptr<PendingCompletion> pending;
    std::exception_ptr error;
    Clock::time_point finished;
  };

  // Runs one operation on this thread (running_ is already set), completes
  // its Work (or leaves it outstanding) and releases the engine.
  // `on_issuing_thread`: run inline; the Work and the recorder already
  // know it started, and nothing may be left outstanding.
  template <typename Fn>
  void execute(const std::shared_ptr<Work>& work, Fn& fn, Clock::time_point started, bool on_issuing_thread = false) {
    OpContext op = context_for(*work, started);
    std::unique_ptr<PendingCompletion> pending;
    if (!on_issuing_thread) {
      op.defer = &pending;
      work->mark_started(to_us(started));
      if (recorder_) recorder_->started(work->seq(), to_us(started));
    }
    std::exception_ptr error;
    try {
      fn(op);
    } catch (...) {
      error = std::current_exception();
    }
    op.defer = nullptr;
    const auto finished = on_issuing_thread && !precise_issue_ ? clock_.coarse_now() : clock_.now();
    if (on_issuing_thread || !leave_outstanding(work, op, std::move(pending), error, finished))
      finish(*work, error, finished);
  }

  OpContext context_for(const Work& work, Clock::time_point started) const;
  std::exception_ptr refusal(const Work& work) const;
  // Records the end of an operation (recorder, timeline, the engine's
  // first error) and returns the error its Work completes with.
  std::exception_ptr conclude(const Work& work, std::exception_ptr error, Clock::time_point finished);
  void finish(Work& work, std::exception_ptr error, Clock::time_point finished);
  // Keeps an operation outstanding, releasing the engine, when its work is
  // pending or operations before it still are; false when neither.
  bool leave_outstanding(const std::shared_ptr<Work>& work, const OpContext& op,
                         std::unique_ptr<PendingCompletion> pending, std::exception_ptr error,
                         Clock::time_point finished);
  // Completes the outstanding operations that are done, in order; stops at
  // the first still running.
  void poll_outstanding();
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
  std::deque<Outstanding> outstanding_;  // changed under mutex_, by the progress thread only
  std::uint64_t next_seq_ = 0;
  bool running_ = false;  // an operation is executing (on some thread)
  bool stopping_ = false;
  std::exception_ptr abort_error_;
  std::atomic<bool> cancel_{false};  // set with abort_error_; running operations watch it (OpContext::cancel)
  std::thread thread_;
};

}  // namespace lockstep::detail
