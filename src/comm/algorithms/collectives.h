// Every collective written once over a Transport (comm/transport.h): the
// tcp backend is this class over its mesh, and hier runs it over the same
// mesh (and its parts over the ring of ranks that share a local index)
// wherever the hierarchy does not help. A future transport gets all of
// them by implementing transfer().
//
// Algorithms, by message size (bytes in the accumulation type):
//   allreduce       <= small: recursive doubling (log2 n exchange rounds; a
//                   non-power-of-two world first folds its extra ranks in);
//                   larger: ring reduce-scatter + ring allgather (ring.h)
//   broadcast       <= small: binomial tree; larger: pipelined chain
//   allgather       ring
//   reduce_scatter  ring reduce-scatter
//   reduce          <= small: binomial tree; larger: ring reduce-scatter +
//                   direct gather to the root
//   gather/scatter  the root exchanges with every rank at once
//   all_to_all      every pair at once (also allgather with per-rank counts)
//   barrier         dissemination (ceil(log2 n) rounds of one byte)
// Rooted collectives (broadcast, reduce, gather, scatter) first check that
// every rank names the same root (root_agreement.h). f16/bf16 are reduced
// in fp32 through comm/accumulation.h and rounded once; final results
// travel in 16 bits. One file per collective beside this one.
//
// Not thread-safe: driven by the group's progress thread, as its transport.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/block_counts.h"
#include "comm/scratch.h"
#include "comm/transport.h"

namespace lockstep {

class TransportCollectives {
 public:
  // `small_bytes`: the crossover between the latency- and the
  // bandwidth-optimal algorithms.
  TransportCollectives(Transport& transport, std::size_t small_bytes)
      : transport_(transport), small_bytes_(small_bytes) {}

  Transport& transport() const { return transport_; }
  std::size_t small_bytes() const { return small_bytes_; }

  // The operations of comm/backend.h, with its contracts.
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op);
  void broadcast(const OpContext& op, Buffer data, int root);
  void allgather(const OpContext& op, ConstBuffer input, Buffer output);
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op);
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op);
  void barrier(const OpContext& op);
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root);
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root);
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts);
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output, const std::vector<std::size_t>& counts);

 private:
  Transport& transport_;
  std::size_t small_bytes_;
  Scratch accumulation_;  // the data in its accumulation type, or a copy of const input
  Scratch staging_;       // received data waiting to be reduced
};

}  // namespace lockstep
