// The nccl backend: every collective is NCCL's own, run on this rank's GPU.
//
//   device        bound at construction: cuda:(local rank % visible
//                 devices); CUDA memory of another device is refused
//   communicator  non-blocking, polled (communicator.h); one GPU per rank,
//                 as NCCL requires
//   collectives   allreduce, broadcast, allgather, reduce_scatter, reduce
//                 are NCCL's; gather, scatter, all_to_all, allgather_v,
//                 send and recv are grouped ncclSend/ncclRecv; barrier is a
//                 one-element allreduce on device scratch; a recv from any
//                 source is refused (NCCL has none)
//   completion    an operation on CUDA memory returns once queued, its
//                 completion polled by the progress engine (so the device
//                 gets bucket after bucket with no host wait between
//                 them); one on host memory returns when its device work
//                 is done (placement.h). The issuing thread never waits
//   host memory   copied through device scratch on the backend's stream
//
// Not thread-safe: one operation at a time, on the group's progress thread.
#pragma once

#include <memory>

#include "comm/backend.h"
#include "comm/nccl/communicator.h"
#include "comm/nccl/device_scratch.h"
#include "comm/nccl/placement.h"
#include "device/cuda_runtime.h"

namespace lockstep::nccl {

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const BackendContext& ctx);
  ~NcclBackend() override;

  std::string_view name() const override { return "nccl"; }
  bool handles_device_memory() const override { return true; }
  bool supports(Collective collective, DType dtype, ReduceOp op) const override;

  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override;
  void allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void broadcast(const OpContext& op, Buffer data, int root) override;
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override;
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) override;
  void barrier(const OpContext& op) override;
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) override;
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                   const std::vector<std::size_t>& counts) override;
  void send(const OpContext& op, ConstBuffer data, int dst, int tag) override;
  void recv(const OpContext& op, Buffer data, int src, int tag) override;
  // NCCL has no receive from any source (ncclRecv names its peer):
  // refused by the front end with why_no_recv_any().
  int recv_any(const OpContext& op, Buffer data, int tag) override;
  std::string why_no_recv_any() const override;

  void shutdown(Deadline deadline) override;

 private:
  // A placement of `op`'s buffers on this backend's device.
  Placement place(const OpContext& op);

  int rank_;
  int size_;
  int device_;
  // Created with device_ current; destroyed in reverse order.
  std::unique_ptr<cuda::Stream> host_stream_;
  std::unique_ptr<cuda::Event> done_;
  std::shared_ptr<cuda::Event> last_deferred_;  // the end of the last operation left to the engine
  DeviceScratch input_scratch_;
  DeviceScratch output_scratch_;
  DeviceScratch barrier_word_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace lockstep::nccl
