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
//   allgather   allgather across hosts among the ranks of each local
//               rank, then allgather inside the host (allgather.cc).
//   reduce_scatter  the reverse: reduce-scatter inside the host, then
//               across hosts (reduce_scatter.cc).
//   broadcast   the root's cross-host ring carries the data to every host
//               (tree or chain), then shm broadcasts it inside each host.
//   the rest    (reduce, gather, scatter, all_to_all, allgather_v, barrier,
//               send/recv) are forwarded to the flat tcp backend: the
//               shared collectives of comm/algorithms/ over every rank.
//               Their traffic is latency-bound, rooted, or pairwise, so a
//               hierarchy saves no bytes on the wire (docs/algorithms.md).
// Hosts with unequal rank counts, and one rank per host, run everything on
// the flat tcp mesh.
//
// Not thread-safe: used by the group's progress thread only (which, inside
// a pipelined allreduce, hands the cross-host transport to one worker
// thread and does not touch it until the worker is done).
#pragma once

#include <memory>
#include <optional>

#include "comm/algorithms/collectives.h"
#include "comm/forwarding_backend.h"
#include "comm/hier/host_layout.h"
#include "comm/scratch.h"
#include "comm/tcp/tcp_backend.h"
#include "comm/transport.h"

namespace lockstep {

class HierBackend final : public ForwardingBackend {
 public:
  explicit HierBackend(const BackendContext& ctx);

  std::string_view name() const override { return "hier"; }
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override;
  void broadcast(const OpContext& op, Buffer data, int root) override;
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override;
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void shutdown(Deadline deadline) override;
  // allreduce_into copies and reduces in place (Backend's), so that it
  // takes the hierarchical allreduce rather than the flat one.
  void allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override {
    Backend::allreduce_into(op, input, output, reduce_op);
  }

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
  std::optional<TransportCollectives> across_collectives_;  // the shared collectives over across_
  // allreduce's scratch, one slot per piece.
  Scratch padded_;    // the input in fp32 and/or padded to a multiple of the local size; reduce_scatter's laid-out copy
  Scratch shard_;     // this rank's shards in the accumulation type; reduce_scatter's row
  Scratch narrow_;    // the finished shards in the caller's 16-bit type
  Scratch gathered_;  // the last piece's padded result before it is copied out; allgather's table
  Scratch staging_;   // received data waiting to be reduced (cross-host step; the worker's when pipelined)
};

std::unique_ptr<Backend> make_hier_backend(const BackendContext& ctx);

}  // namespace lockstep
