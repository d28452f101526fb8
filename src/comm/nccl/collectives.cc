// The nccl backend's collectives that are NCCL collectives: each places
// its buffers (placement.h), queues one NCCL call on the operation's
// stream, and waits for it. Not thread-safe: see nccl_backend.h.
#include <fmt/format.h>

#include "comm/nccl/nccl_backend.h"
#include "comm/nccl/types.h"

namespace lockstep::nccl {

void NcclBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  void* d = p.output(data, /*copy_in=*/true);
  comm_->settle(ncclAllReduce(d, d, data.count, to_nccl(data.dtype), to_nccl(reduce_op), comm, p.stream()), op,
                "queueing ncclAllReduce");
  p.finish("waiting for ncclAllReduce");
}

void NcclBackend::allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false);
  comm_->settle(ncclAllReduce(in, out, output.count, to_nccl(output.dtype), to_nccl(reduce_op), comm, p.stream()),
                op, "queueing ncclAllReduce");
  p.finish("waiting for ncclAllReduce");
}

void NcclBackend::broadcast(const OpContext& op, Buffer data, int root) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  void* d = p.output(data, /*copy_in=*/rank_ == root);
  comm_->settle(ncclBroadcast(d, d, data.count, to_nccl(data.dtype), root, comm, p.stream()), op,
                "queueing ncclBroadcast");
  p.finish("waiting for ncclBroadcast");
}

void NcclBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false);
  comm_->settle(ncclAllGather(in, out, input.count, to_nccl(input.dtype), comm, p.stream()), op,
                "queueing ncclAllGather");
  p.finish("waiting for ncclAllGather");
}

void NcclBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false);
  comm_->settle(
      ncclReduceScatter(in, out, output.count, to_nccl(output.dtype), to_nccl(reduce_op), comm, p.stream()), op,
      "queueing ncclReduceScatter");
  p.finish("waiting for ncclReduceScatter");
}

// In place: NCCL writes the receive buffer on the root only, so the other
// ranks' data stays as it was (and host memory is not copied back there).
void NcclBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  void* d = p.output(data, /*copy_in=*/true, /*copy_back=*/rank_ == root);
  comm_->settle(ncclReduce(d, d, data.count, to_nccl(data.dtype), to_nccl(reduce_op), root, comm, p.stream()), op,
                "queueing ncclReduce");
  p.finish("waiting for ncclReduce");
}

}  // namespace lockstep::nccl
