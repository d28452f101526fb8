// Allreduce over any Transport, on data already in its accumulation type
// (fp32 for 16-bit types): recursive doubling for small messages, ring
// reduce-scatter + ring allgather (ring.h) for large ones. The tcp backend
// builds its allreduce from these pieces; hier runs allreduce_accumulated
// across hosts on each rank's shard.
//
// Every rank ends with bitwise-identical results. avg is reduced as a sum:
// the caller divides (it alone knows by how many ranks in total).
//
// Not thread-safe: runs on the progress thread.
#pragma once

#include <cstddef>

#include "comm/scratch.h"
#include "comm/transport.h"
#include "lockstep/types.h"

namespace lockstep {

// Recursive doubling of `acc` (count elements of dtype) in place: log2 n
// exchange rounds, after folding a non-power-of-two world's extra ranks in.
void allreduce_recursive_doubling(Transport& transport, const OpContext& op, void* acc, std::size_t count,
                                  DType dtype, ReduceOp reduce_op, Scratch& staging);

// The whole allreduce of `acc` in place: recursive doubling up to
// `small_bytes`, the two ring passes above.
void allreduce_accumulated(Transport& transport, const OpContext& op, void* acc, std::size_t count, DType dtype,
                           ReduceOp reduce_op, std::size_t small_bytes, Scratch& staging);

}  // namespace lockstep
