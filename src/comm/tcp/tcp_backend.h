// The tcp backend: collectives over a full mesh of TCP connections. Works on
// one host and across hosts, for any world size.
//
// Algorithms, by message size (bytes in the accumulation type):
//   allreduce       <= small: recursive doubling (log2 n exchange rounds; a
//                   non-power-of-two world first folds its extra ranks in);
//                   larger: ring reduce-scatter + ring allgather (algorithms/ring.h)
//   broadcast       <= small: binomial tree; larger: pipelined chain
//   allgather       ring
//   reduce_scatter  ring reduce-scatter
//   reduce          <= small: binomial tree; larger: ring reduce-scatter +
//                   direct gather to the root
//   gather/scatter  the root exchanges with every rank at once
//   all_to_all      every pair at once (also allgather with per-rank counts)
//   barrier         dissemination (ceil(log2 n) rounds of one byte)
//   send / recv     a header (tag, byte count) checked by the receiver, then
//                   the payload
// Every collective's data carries its stamp (op_stamp.h); rooted ones
// (broadcast, reduce, gather, scatter) first pass the stamp around the ring.
// f16/bf16 are accumulated in fp32 (partial results travel as fp32) and
// rounded once; final results travel in 16 bits.
//
// One file per collective (allreduce.cc, broadcast.cc, ...), as each
// backend folder does. The ring, recursive doubling and broadcast
// algorithms are not tcp's own: they live in comm/algorithms/ and run over
// the Transport interface, which the mesh implements (hier runs the same
// code across hosts).
//
// Not thread-safe: used by the group's progress thread only.
#pragma once

#include "comm/backend.h"
#include "comm/scratch.h"
#include "comm/tcp/mesh.h"

namespace lockstep {

class TcpBackend final : public Backend {
 public:
  explicit TcpBackend(const BackendContext& ctx);

  std::string_view name() const override { return "tcp"; }
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

  // The mesh as a transport over every rank of the group, for a backend
  // built on this one (hier runs its cross-host step on a subset of it).
  Transport& transport() { return mesh_; }
  std::size_t small_bytes() const { return small_bytes_; }

  // The check rooted collectives make before their data (root_agreement.cc):
  // every rank's stamp checked by the next rank around the ring, so ranks
  // that disagree on the root (and so may exchange no data at all) raise
  // MismatchError at this collective. Public for hier's cross-host steps.
  void check_agreement_around_the_ring(const OpContext& op);

  // The default crossover between latency- and bandwidth-optimal algorithms,
  // measured on loopback and a 2-core host (see docs/performance.md).
  static constexpr std::size_t kDefaultSmallBytes = 64 * 1024;

 private:
  void reduce_tree(const OpContext& op, void* acc, std::size_t count, DType dtype, int root, ReduceOp reduce_op);

  Mesh mesh_;
  std::size_t small_bytes_;
  Scratch accumulation_;  // fp32 copy of 16-bit data, or a copy of const input
  Scratch staging_;       // received data waiting to be reduced
};

}  // namespace lockstep
