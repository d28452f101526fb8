// The c10d::Backend "lockstep": PyTorch's collectives (torch.distributed,
// DistributedDataParallel) on a lockstep process group. Formed from the
// store, rank and size that init_process_group / new_group hand it; each
// operation is lockstep's torch.distributed function of the same name
// (lockstep/torch/distributed.h: the checks, the views, the copies into
// and out of lists), issued asynchronously and returned as a LockstepWork.
// What lockstep cannot do is refused with an error naming the operation.
// Operations are issued in call order, which must match across ranks;
// calls come from one thread at a time (PyTorch's contract for a group).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "lockstep/process_group.h"
#include "lockstep/torch/distributed.h"

namespace lockstep_torch {

class LockstepBackend final : public c10d::Backend {
 public:
  // `group_name`: unique per group in the job (PyTorch's group id).
  LockstepBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, const std::string& group_name);
  ~LockstepBackend() override;

  const std::string getBackendName() const override { return "lockstep"; }
  // The lockstep backend underneath ("shm", "tcp", "hier").
  const std::string& transport() const { return group().backend(); }

  // destroy_process_group: the lockstep group ends now (its watchdog stops
  // polling the store, and it leaves while the peers and the store are
  // still up), not when the last reference to this backend goes: a
  // DeviceMesh (DTensor, FSDP2) keeps one until the interpreter exits.
  // Later operations are refused.
  void shutdown() override;
  // torch.distributed's abort: this rank's running operation fails, and
  // the peers' groups abort with it, as on any lockstep failure.
  void abort() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // batch_isend_irecv: between the two calls, sends and receives are held
  // back; endCoalescing issues them in an order every rank derives alike
  // (the lower rank of each pair sends first), so a ring exchange of large
  // messages cannot wait in a cycle. Collectives are issued at once.
  bool supportsCoalescing() const override { return true; }

  // The number of operations this group has issued (c10d's sequence
  // number, which TORCH_DISTRIBUTED_DEBUG=DETAIL's checks of every
  // collective read; lockstep checks that the ranks agree on each
  // operation in any case).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return operations_; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  c10::intrusive_ptr<c10d::Work> finish(c10d::OpType type, std::vector<std::shared_ptr<lockstep::Work>> parts,
                                        std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep_alive = {});
  c10::intrusive_ptr<c10d::Work> point_to_point(lockstep::torch::P2POp op);
  // One all_gather per input i into per_input[i] (a tensor per rank).
  c10::intrusive_ptr<c10d::Work> gather_each_input(const char* op, std::vector<std::vector<at::Tensor>>& per_input,
                                                   std::vector<at::Tensor>& inputs);

  // The lockstep group; refused after shutdown().
  lockstep::ProcessGroup& group() const;
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(const at::Tensor& t, const c10d::AllreduceOptions& opts);

  std::shared_ptr<lockstep::ProcessGroup> group_;
  uint64_t operations_ = 0;
  bool coalescing_ = false;
  std::vector<lockstep::torch::P2POp> held_;  // while coalescing
};

}  // namespace lockstep_torch
