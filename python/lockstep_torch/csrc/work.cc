// LockstepWork (see work.h).
#include "work.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
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
    case c10d::OpType::RECVANYSOURCE: return "recv";
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
      // The words gloo's timeouts use, which programs and PyTorch's own
      // tests look for in the message.
      const bool timed_out = dynamic_cast<const lockstep::TimeoutError*>(&e) != nullptr;
      const std::string what = timed_out ? "Timed out waiting for the other ranks. " + std::string(e.what()) : e.what();
      C10_THROW_ERROR(DistBackendError, "lockstep: " + where + what);
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return std::current_exception();  // not a std::exception: passed on as it is
  }
}

namespace {

// The current stream of the CUDA device the tensors are on (the one the
// operations were issued on), or none when they are on the CPU. Through
// c10's device-generic interface, so the CPU build needs no CUDA headers.
std::optional<c10::Stream> issue_stream_of(const std::vector<at::Tensor>& outputs,
                                           const std::vector<at::Tensor>& inputs) {
  for (const auto* list : {&outputs, &inputs})
    for (const auto& t : *list)
      if (t.defined() && t.is_cuda()) return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getStream(t.device());
  return std::nullopt;
}

c10::intrusive_ptr<c10::ivalue::Future> future_for(const std::optional<c10::Stream>& stream) {
  auto type = c10::ListType::create(c10::TensorType::get());
  if (!stream) return c10::make_intrusive<c10::ivalue::Future>(type);
  return c10::make_intrusive<c10::ivalue::Future>(type, std::vector<c10::Device>{stream->device()});
}

}  // namespace

LockstepWork::LockstepWork(int rank, c10d::OpType type, std::vector<std::shared_ptr<lockstep::Work>> parts,
                           std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive)
    : c10d::Work(rank, type),
      parts_(std::move(parts)),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      issue_stream_(issue_stream_of(outputs_, keep_alive_)),
      future_(future_for(issue_stream_)) {}

c10::intrusive_ptr<LockstepWork> LockstepWork::start(int rank, c10d::OpType type,
                                                     std::vector<std::shared_ptr<lockstep::Work>> parts,
                                                     std::vector<at::Tensor> outputs,
                                                     std::vector<at::Tensor> keep_alive) {
  auto work = c10::make_intrusive<LockstepWork>(rank, type, std::move(parts), std::move(outputs),
                                                std::move(keep_alive));
  if (work->parts_.empty()) {
    work->finish_parts();
    return work;
  }
  // The callbacks keep the Work alive until they ran: PyTorch may drop the
  // Work before the operation ends (DDP keeps only its future).
  std::shared_ptr<lockstep::Work> last = work->parts_.back();
  last->on_complete([work](const lockstep::Work&) { work->finish_parts(); });
  // CUDA: the future completes once `last` counts as done (after the
  // on_complete callbacks), when its wait() can order the issue stream.
  // A failed operation skips this; finish_parts() has failed the future.
  if (work->issue_stream_) last->then([work, last](const lockstep::Work&) { work->complete_on_device(*last); });
  return work;
}

// Runs once, on the group's thread when the last part completes (or here
// at once when it already has): the first part's error, if any, then the
// future, whose callbacks (DDP's) run inline.
void LockstepWork::finish_parts() {
  std::exception_ptr error;
  for (const auto& part : parts_)
    if (!error) error = part->error();
  if (!issue_stream_) keep_alive_.clear();  // CUDA: until the issue stream is ordered (complete_on_device)
  error_ = error ? to_torch_error(error, torch_call(retrieveOpType())) : nullptr;
  finished_.store(true, std::memory_order_release);
  try {
    if (error_) future_->setError(error_);
    else if (!issue_stream_) future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    // A future callback that throws must not escape into the group's thread.
  }
}

// Runs once, on the group's thread: `last` succeeded and its host side is
// done. Its wait() makes the issue stream wait for the device work of every
// part (the group runs them in order on one stream); the future, marked
// with the issue stream current, records its event there, after that wait.
// The tensors kept alive may go now: their memory is reused only in the
// order of the issue stream, which they were allocated on.
void LockstepWork::complete_on_device(lockstep::Work& last) {
  try {
    last.wait();
    c10::StreamGuard on_issue_stream(*issue_stream_);
    future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
    const std::exception_ptr error = to_torch_error(std::current_exception(), torch_call(retrieveOpType()));
    try {
      if (!future_->completed()) future_->setError(error);
    } catch (...) {
      // As in finish_parts: nothing escapes into the group's thread.
    }
  }
  keep_alive_.clear();
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
  // CUDA: the parts ordered the issue stream; the future, completed just
  // after them, orders the caller's current stream (if another) after it.
  if (issue_stream_) future_->wait();
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> LockstepWork::getFuture() { return future_; }

int LockstepWork::sourceRank() const {
  const c10d::OpType type = retrieveOpType();
  // A receive held for batch_isend_irecv has no part of its own here.
  if ((type != c10d::OpType::RECV && type != c10d::OpType::RECVANYSOURCE) || parts_.size() != 1)
    return c10d::Work::sourceRank();
  const int source = parts_.front()->source_rank();
  TORCH_CHECK(source >= 0, "lockstep backend: the recv has not received its message yet",
              error_ ? " (it failed)" : "", "; call wait() first");
  return source;
}

}  // namespace lockstep_torch
