// The nccl backend's operations built from ncclSend/ncclRecv: gather,
// scatter, all_to_all, allgather_v (each one NCCL group, so every transfer
// of the operation progresses together and none waits for a receive that
// is not posted yet), and send/recv. A rank's block for itself is a device
// copy on the same stream. Not thread-safe: see nccl_backend.h.
#include <string>

#include <fmt/format.h>

#include "comm/nccl/nccl_backend.h"
#include "comm/nccl/types.h"

namespace lockstep::nccl {
namespace {

// The transfers of one operation, between ncclGroupStart and ncclGroupEnd.
// A failed call is remembered and reported after the group is closed: NCCL
// wants every group it opened closed.
class PeerExchange {
 public:
  PeerExchange(Communicator& comm, const OpContext& op, cudaStream_t stream, int self)
      : comm_(comm), handle_(comm.get(op)), op_(op), stream_(stream), self_(self) {
    const ncclResult_t started = ncclGroupStart();
    closed_ = started != ncclSuccess;  // a group that did not open is not closed
    comm_.settle(started, op_, "opening an NCCL group");
  }
  ~PeerExchange() {
    if (!closed_) ncclGroupEnd();
  }
  PeerExchange(const PeerExchange&) = delete;
  PeerExchange& operator=(const PeerExchange&) = delete;

  void send(const void* data, std::size_t count, DType dtype, int peer) {
    if (count != 0 && first_error_ == ncclSuccess)
      first_error_ = ncclSend(data, count, to_nccl(dtype), peer, handle_, stream_);
  }
  void recv(void* data, std::size_t count, DType dtype, int peer) {
    if (count != 0 && first_error_ == ncclSuccess)
      first_error_ = ncclRecv(data, count, to_nccl(dtype), peer, handle_, stream_);
  }
  // This rank's block for itself.
  void copy_to_self(const void* from, void* to, std::size_t count, DType dtype) {
    if (count == 0 || from == to) return;
    cuda::check(cudaMemcpyAsync(to, from, count * dtype_size(dtype), cudaMemcpyDeviceToDevice, stream_),
                fmt::format("{}: copying rank {}'s own block", op_.description(), self_));
  }
  void close() {
    closed_ = true;
    const ncclResult_t ended = ncclGroupEnd();
    comm_.settle(first_error_, op_, "queueing ncclSend/ncclRecv");
    comm_.settle(ended, op_, "closing the NCCL group of sends and receives");
  }

 private:
  Communicator& comm_;
  ncclComm_t handle_;
  const OpContext& op_;
  cudaStream_t stream_;
  int self_;
  ncclResult_t first_error_ = ncclSuccess;
  bool closed_ = false;
};

}  // namespace

void NcclBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  cuda::DeviceGuard guard(device_);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false, /*copy_back=*/rank_ == root);
  PeerExchange exchange(*comm_, op, p.stream(), rank_);
  if (rank_ == root) {
    for (int q = 0; q < size_; ++q) {
      void* block = at(out, static_cast<std::size_t>(q) * input.count, input.dtype);
      if (q == rank_) exchange.copy_to_self(in, block, input.count, input.dtype);
      else exchange.recv(block, input.count, input.dtype, q);
    }
  } else {
    exchange.send(in, input.count, input.dtype, root);
  }
  exchange.close();
  p.finish("waiting for the gather's transfers");
}

void NcclBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  cuda::DeviceGuard guard(device_);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false);
  PeerExchange exchange(*comm_, op, p.stream(), rank_);
  if (rank_ == root) {
    for (int q = 0; q < size_; ++q) {
      const void* block = at(in, static_cast<std::size_t>(q) * output.count, output.dtype);
      if (q == rank_) exchange.copy_to_self(block, out, output.count, output.dtype);
      else exchange.send(block, output.count, output.dtype, q);
    }
  } else {
    exchange.recv(out, output.count, output.dtype, root);
  }
  exchange.close();
  p.finish("waiting for the scatter's transfers");
}

void NcclBackend::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  cuda::DeviceGuard guard(device_);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false);
  const DType dtype = output.dtype;
  PeerExchange exchange(*comm_, op, p.stream(), rank_);
  for (int q = 0; q < size_; ++q) {
    const void* from = at(in, counts.send_offset(q), dtype);
    void* to = at(out, counts.recv_offset(q), dtype);
    if (q == rank_) {
      exchange.copy_to_self(from, to, counts.send_count(q), dtype);
      continue;
    }
    exchange.send(from, counts.send_count(q), dtype, q);
    exchange.recv(to, counts.recv_count(q), dtype, q);
  }
  exchange.close();
  p.finish("waiting for the all_to_all's transfers");
}

void NcclBackend::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                              const std::vector<std::size_t>& counts) {
  cuda::DeviceGuard guard(device_);
  Placement p = place(op);
  const void* in = p.input(input);
  void* out = p.output(output, /*copy_in=*/false);
  const DType dtype = output.dtype;
  PeerExchange exchange(*comm_, op, p.stream(), rank_);
  std::size_t offset = 0;
  for (int q = 0; q < size_; ++q) {
    const std::size_t count = counts[static_cast<std::size_t>(q)];
    void* to = at(out, offset, dtype);
    if (q == rank_) {
      exchange.copy_to_self(in, to, count, dtype);
    } else {
      exchange.send(in, input.count, dtype, q);
      exchange.recv(to, count, dtype, q);
    }
    offset += count;
  }
  exchange.close();
  p.finish("waiting for the allgather_v's transfers");
}

// NCCL has no tags: messages between two ranks arrive in the order they
// were sent, so a send and a recv pair up by order, and a tag mismatch is
// not detected (the front end's sizes are).
void NcclBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  const void* in = p.input(data);
  if (data.count != 0)
    comm_->settle(ncclSend(in, data.count, to_nccl(data.dtype), dst, comm, p.stream()), op, "queueing ncclSend");
  p.finish("waiting for ncclSend");
}

void NcclBackend::recv(const OpContext& op, Buffer data, int src, int tag) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  Placement p = place(op);
  void* out = p.output(data, /*copy_in=*/false);
  if (data.count != 0)
    comm_->settle(ncclRecv(out, data.count, to_nccl(data.dtype), src, comm, p.stream()), op, "queueing ncclRecv");
  p.finish("waiting for ncclRecv");
}

std::string NcclBackend::why_no_recv_any() const {
  return "the nccl backend cannot receive from any source: NCCL has no such receive (ncclRecv names its peer). "
         "Name the source (recv(data, src, tag); torch.distributed: recv(tensor, src=...)), or receive through a "
         "group of a backend that can (tcp, shm, hier or mpi: GroupOptions::backend, with a GroupOptions::name of "
         "its own; torch.distributed: a new_group with backend \"gloo\")";
}

int NcclBackend::recv_any(const OpContext&, Buffer, int) { throw InvalidArgument(why_no_recv_any()); }

}  // namespace lockstep::nccl
