// The hier backend: ranks grouped by host (BackendContext::host_ids). Inside
// a host the ranks talk through a shm backend over the host's ranks; across
// hosts through the tcp mesh, where the ranks with the same local rank on
// each host form a ring (a TransportSubset of the mesh running the shared
// algorithms of comm/algorithms/).
//
// Algorithms (see docs/algorithms.md for the costs):
//   allreduce   reduce-scatter inside the host (shm), allreduce of this
//               rank's shard across hosts (recursive doubling or ring, by
//               size), allgather inside the host (shm): each host sends
//               its data over the wire once instead of once per rank.
//               From 2 x kPipelinePieceBytes up, in pieces whose
//               cross-host step (on a worker thread) overlaps the shm
//               steps of the pieces before and after it.
//   broadcast   the root's cross-host ring carries the data to every host
//               (tree or chain), then shm broadcasts it inside each host.
//   the rest    (reduce, allgather, reduce_scatter, gather, scatter,
//               all_to_all, allgather_v, barrier, send/recv) run on the flat
//               tcp mesh over every rank, as the tcp backend does.
// Hosts with unequal rank counts run everything on the flat tcp mesh.
//
// Not thread-safe: used by the group's progress thread only (which, inside
// a pipelined allreduce, hands the cross-host transport to one worker
// thread and does not touch it until the worker is done).
#pragma once

#include <memory>
#include <optional>

#include "comm/backend.h"
#include "comm/hier/host_layout.h"
#include "comm/scratch.h"
#include "comm/tcp/tcp_backend.h"
#include "comm/transport.h"

namespace lockstep {

class HierBackend final : public Backend {
 public:
  explicit HierBackend(const BackendContext& ctx);

  std::string_view name() const override { return "hier"; }
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override;
  void broadcast(const OpContext& op, Buffer data, int root) override;
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override;
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) override;
  void barrier(const OpContext& op) override;
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) override;
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output, const std::vector<std::size_t>& counts) override;
  void send(const OpContext& op, ConstBuffer data, int dst, int tag) override;
  void recv(const OpContext& op, Buffer data, int src, int tag) override;
  void shutdown(Deadline deadline) override;

 private:
  // A pipelined allreduce's piece: enough to hide the per-piece costs (one
  // shm synchronisation per step, one cross-host round trip), small enough
  // that filling and draining the pipeline (step 1 of the first piece, step 3
  // of the last) is a small share. Measured in docs/performance.md.
  static constexpr std::size_t kPipelinePieceBytes = std::size_t{4} << 20;
  static constexpr std::size_t kPipelineMaxPieces = 16;
  struct Piece;

  bool hierarchical() const { return layout_.uniform && layout_.hosts > 1; }
  // How many pieces an allreduce of `bytes` is cut into (1: not pipelined).
  std::size_t pipeline_pieces(std::size_t bytes) const;
  void reduce_inside_host(const OpContext& op, Piece& piece, ReduceOp reduce_op);
  void reduce_across_hosts(const OpContext& op, Piece& piece, ReduceOp reduce_op);
  void gather_inside_host(const OpContext& op, Piece& piece);

  int size_;
  HostLayout layout_;
  TcpBackend flat_;                        // the mesh over every rank
  std::unique_ptr<Backend> local_;         // shm over this host's ranks; null when alone on the host
  std::optional<TransportSubset> across_;  // this local rank's ring across hosts (uniform layouts)
  // allreduce's scratch, one slot per piece.
  Scratch padded_;    // the input in fp32 and/or padded to a multiple of the local size
  Scratch shard_;     // this rank's shards in the accumulation type
  Scratch narrow_;    // the finished shards in the caller's 16-bit type
  Scratch gathered_;  // the last piece's padded result before it is copied out
  Scratch staging_;   // received data waiting to be reduced (cross-host step; the worker's when pipelined)
};

std::unique_ptr<Backend> make_hier_backend(const BackendContext& ctx);

}  // namespace lockstep
