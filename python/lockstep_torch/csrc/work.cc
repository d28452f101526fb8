// LockstepWork (see work.h).
#include "work.h"

#include <c10/util/Exception.h>

#include "lockstep/error.h"

namespace lockstep_torch {

std::string_view torch_call(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "all_gather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "all_gather_coalesced";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE: return "all_to_all_single";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::SEND: return "send";
    case c10d::OpType::RECV: return "recv";
    case c10d::OpType::BARRIER: return "barrier";
    case c10d::OpType::COALESCED: return "batch_isend_irecv";
    default: return "";
  }
}

std::exception_ptr to_torch_error(std::exception_ptr error, std::string_view call) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error&) {
    return std::current_exception();
  } catch (const std::exception& e) {
    try {
      const std::string where = call.empty() ? "" : "torch.distributed." + std::string(call) + ": ";
      C10_THROW_ERROR(DistBackendError, "lockstep: " + where + e.what());
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return std::current_exception();  // not a std::exception: passed on as it is
  }
}

LockstepWork::LockstepWork(int rank, c10d::OpType type, std::vector<std::shared_ptr<lockstep::Work>> parts,
                           std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive)
    : c10d::Work(rank, type),
      parts_(std::move(parts)),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

c10::intrusive_ptr<LockstepWork> LockstepWork::start(int rank, c10d::OpType type,
                                                     std::vector<std::shared_ptr<lockstep::Work>> parts,
                                                     std::vector<at::Tensor> outputs,
                                                     std::vector<at::Tensor> keep_alive) {
  auto work = c10::make_intrusive<LockstepWork>(rank, type, std::move(parts), std::move(outputs),
                                                std::move(keep_alive));
  if (work->parts_.empty()) {
    work->finish_parts();
  } else {
    // The callback keeps the Work alive until it ran: PyTorch may drop the
    // Work before the operation ends (DDP keeps only its future).
    work->parts_.back()->on_complete([work](const lockstep::Work&) { work->finish_parts(); });
  }
  return work;
}

// Runs once, on the group's thread when the last part completes (or here
// at once when it already has): the first part's error, if any, then the
// future, whose callbacks (DDP's) run inline.
void LockstepWork::finish_parts() {
  std::exception_ptr error;
  for (const auto& part : parts_)
    if (!error) error = part->error();
  keep_alive_.clear();
  error_ = error ? to_torch_error(error, torch_call(retrieveOpType())) : nullptr;
  finished_.store(true, std::memory_order_release);
  try {
    if (error_) future_->setError(error_);
    else future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    // A future callback that throws must not escape into the group's thread.
  }
}

bool LockstepWork::isCompleted() { return finished_.load(std::memory_order_acquire); }

bool LockstepWork::isSuccess() const { return finished_.load(std::memory_order_acquire) && !error_; }

std::exception_ptr LockstepWork::exception() const {
  return finished_.load(std::memory_order_acquire) ? error_ : nullptr;
}

std::vector<at::Tensor> LockstepWork::result() { return outputs_; }

bool LockstepWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout.count() > 0 ? lockstep::Duration(timeout.count()) : lockstep::Duration::max();
  try {
    for (const auto& part : parts_) part->wait(limit);
  } catch (...) {
    std::rethrow_exception(to_torch_error(std::current_exception(), torch_call(retrieveOpType())));
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> LockstepWork::getFuture() { return future_; }

}  // namespace lockstep_torch
