// One NCCL communicator of a group, created non-blocking so that no NCCL
// call can hold the progress thread past a deadline: creation, every
// enqueued operation and finalisation are polled (ncclCommGetAsyncError and
// a CUDA event) against the operation's deadline and cancellation, and a
// communicator that misses one is aborted, never waited on again.
//
// Protocol: rank 0 makes the unique id and sets it in the group's store
// under kUniqueIdKey; the others wait for it there, up to the connect
// timeout. The store is already private to the group.
//
// Not thread-safe: used by the thread that runs the group's operations,
// with the backend's CUDA device current.
#pragma once

#include <nccl.h>

#include <string>
#include <string_view>

#include "comm/backend.h"
#include "device/cuda_runtime.h"

namespace lockstep::nccl {

inline constexpr char kUniqueIdKey[] = "nccl/unique_id";

class Communicator {
 public:
  // Joins the group's communicator on the current device (`device`, for
  // messages). ConfigError when NCCL refuses the placement (two ranks on
  // one GPU), TimeoutError when the peers do not all arrive in time.
  Communicator(const BackendContext& ctx, int device);
  // Aborts a communicator that was not shut down: destroying one could wait
  // for peers forever.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // The communicator for the next call; throws when an earlier operation
  // aborted it (the group cannot run more operations).
  ncclComm_t get(const OpContext& op) const;

  // Finishes an NCCL call of `op`: ncclSuccess returns, ncclInProgress
  // polls until NCCL has taken the call, an error aborts and throws.
  void settle(ncclResult_t result, const OpContext& op, std::string_view what);
  // Polls until the work before `done` was recorded is finished, while
  // watching for asynchronous NCCL errors, the deadline and cancellation;
  // on any of them aborts the communicator and throws.
  void wait(const cuda::Event& done, const OpContext& op, std::string_view what);
  // One look: whether the work before `done` is finished; throws as wait()
  // does on an error, the deadline or cancellation.
  bool poll(const cuda::Event& done, const OpContext& op, std::string_view what);

  // Clean end: finalize (flushes outstanding work) and destroy, polled up to
  // `deadline`; aborts instead when that fails. Never throws.
  void shutdown(Deadline deadline) noexcept;

 private:
  // The communicator's state: ncclSuccess, ncclInProgress or an error.
  ncclResult_t async_state() const;
  // Aborts the communicator (if not done yet), remembering why.
  void abort(std::string reason) noexcept;
  [[noreturn]] void fail(ncclResult_t state, const OpContext& op, std::string_view what);
  [[noreturn]] void fail_waiting(const OpContext& op, std::string_view what);
  std::string who() const;

  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  std::string aborted_because_;  // empty while usable
};

}  // namespace lockstep::nccl
