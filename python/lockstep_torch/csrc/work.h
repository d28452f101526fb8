// The c10d::Work a lockstep collective returns to PyTorch: it completes when
// the lockstep operations behind it do (one, or several for the coalesced
// forms), and completes a Future that DDP's communication hooks chain on.
//
// CUDA tensors follow c10d's CUDA semantics: the operations were issued on
// the tensors' current stream (the "issue stream"); wait() makes the
// caller's current stream wait for their device work, without blocking the
// host on it; the Future is CUDA-aware (c10::ivalue::Future with the
// tensors' device), marked completed with the issue stream ordered after
// the device work, so its value(), wait() and then() order the stream that
// uses the result after the collective, as ProcessGroupNCCL's does.
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "lockstep/process_group.h"

namespace lockstep_torch {

// A lockstep error (or any exception) as PyTorch's DistBackendError, whose
// message keeps lockstep's diagnosis and starts with the function the user
// called (`call`, e.g. "all_gather_into_tensor": lockstep's own text names
// the collective underneath, "allgather #3"); PyTorch's own errors pass
// unchanged.
std::exception_ptr to_torch_error(std::exception_ptr error, std::string_view call);

// The torch.distributed function behind a c10d operation type, or "" when
// there is no single one.
std::string_view torch_call(c10d::OpType type);

class LockstepWork final : public c10d::Work {
 public:
  // `parts`: the lockstep operations, in issue order (the group runs them
  // in that order, so the last one's completion means all are done).
  // `outputs`: what result() and the future hold. `keep_alive`: staging
  // tensors the operations read or write until they are done (copies out
  // of staging tensors are the parts' own completion callbacks, which run
  // before the one that completes this Work).
  static c10::intrusive_ptr<LockstepWork> start(int rank, c10d::OpType type,
                                                std::vector<std::shared_ptr<lockstep::Work>> parts,
                                                std::vector<at::Tensor> outputs,
                                                std::vector<at::Tensor> keep_alive = {});
  // Use start(), which also hooks the completion.
  LockstepWork(int rank, c10d::OpType type, std::vector<std::shared_ptr<lockstep::Work>> parts,
               std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive = {});

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Waits for the operations; throws DistBackendError with lockstep's
  // diagnosis if one failed or if `timeout` (0: none) passed first.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A recv's sender (dist.recv's return value, work._source_rank()): the
  // source a recv named, or the rank a recv from any source took its
  // message from, once it has arrived. Other operations throw, as c10d's.
  int sourceRank() const override;

 private:
  void finish_parts();
  // CUDA: on the group's thread once `last` counts as done.
  void complete_on_device(lockstep::Work& last);

  const std::vector<std::shared_ptr<lockstep::Work>> parts_;
  const std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_alive_;
  // The CUDA device of the tensors and the issue stream, or none (CPU).
  const std::optional<c10::Stream> issue_stream_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> finished_{false};
  std::exception_ptr error_;  // set before finished_
};

}  // namespace lockstep_torch
