// The tcp backend: collectives over a full mesh of TCP connections. Works on
// one host and across hosts, for any world size.
//
// Every collective is the shared code of comm/algorithms/ (collectives.h
// lists the algorithms) run over the mesh, which implements the Transport
// interface; hier runs the same code across hosts. What is tcp's own: the
// mesh (mesh.h, transfer.h) and point to point (send_recv.cc): a header
// (tag, byte count) checked by the receiver, then the payload; a recv from
// any source takes the first peer with a message waiting (first_sender.h).
// Every transfer's data carries its stamp (op_stamp.h).
//
// Not thread-safe: used by the group's progress thread only.
#pragma once

#include "comm/algorithms/collectives.h"
#include "comm/backend.h"
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
  int recv_any(const OpContext& op, Buffer data, int tag) override;
  void shutdown(Deadline deadline) override;

  // The mesh as a transport over every rank of the group, for a backend
  // built on this one (hier runs its cross-host step on a subset of it).
  Transport& transport() { return mesh_; }
  std::size_t small_bytes() const { return collectives_.small_bytes(); }

  // The default crossover between latency- and bandwidth-optimal algorithms,
  // measured on loopback and a 2-core host (see docs/performance.md).
  static constexpr std::size_t kDefaultSmallBytes = 64 * 1024;

 private:
  Mesh mesh_;
  TransportCollectives collectives_;
  int last_any_source_ = 0;  // the sender recv_any took last; the next looks after it first
};

}  // namespace lockstep
