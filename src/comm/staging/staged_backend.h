// CUDA memory over a backend that moves host memory only (shm, tcp, hier,
// mpi): every operation's buffers are staged through pinned host memory
// (staging_area.h) and the host backend runs on the host copies. Allreduce,
// broadcast and reduce are pipelined in chunks of
// LOCKSTEP_CUDA_STAGING_CHUNK_BYTES, each chunk its own collective of the
// host backend, so every rank must use the same chunk size; the chunks'
// stamps carry the memory's kind, so a rank passing host memory where the
// others pass CUDA memory fails with a MismatchError instead of pairing
// chunks with whole buffers.
//
// Thread-safety: as Backend (one thread at a time).
#pragma once

#include <map>
#include <memory>

#include "comm/backend.h"
#include "comm/staging/staging_area.h"

namespace lockstep::cuda {

class StagedBackend final : public Backend {
 public:
  // `host` (of which this process is `rank`) outlives this backend.
  StagedBackend(Backend& host, int rank, std::size_t chunk_bytes);

  std::string_view name() const override { return host_.name(); }
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override;
  void allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void broadcast(const OpContext& op, Buffer data, int root) override;
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override;
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) override;
  void barrier(const OpContext& op) override { host_.barrier(op); }
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) override;
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                   const std::vector<std::size_t>& counts) override;
  void send(const OpContext& op, ConstBuffer data, int dst, int tag) override;
  void recv(const OpContext& op, Buffer data, int src, int tag) override;
  int recv_any(const OpContext& op, Buffer data, int tag) override;
  std::string why_no_recv_any() const override { return host_.why_no_recv_any(); }
  bool supports(Collective c, DType t, ReduceOp o) const override { return host_.supports(c, t, o); }
  // The host backend's group ends with it; nothing of this one's to say goodbye to.
  void shutdown(Deadline) override {}

 private:
  // The staging area of the operation's device, made current for the call.
  StagingArea& area(const OpContext& op);

  Backend& host_;
  const int rank_;
  const std::size_t chunk_bytes_;
  std::map<int, std::unique_ptr<StagingArea>> areas_;  // per device index
};

}  // namespace lockstep::cuda
