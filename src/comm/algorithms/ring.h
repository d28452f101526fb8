// Ring passes, the bandwidth-optimal building blocks of allreduce,
// reduce_scatter, reduce and allgather, over any Transport (the tcp mesh,
// or the ranks of one local index across hosts in hier).
//
// The buffer is cut into size() chunks. In the reduce-scatter pass each rank
// sends to its right neighbour and receives from its left one; at step s,
// rank r sends chunk (r-s-1) and receives chunk (r-s-2), folding it into its
// own copy, so after size()-1 steps chunk r holds the reduction of everyone's
// chunk r. The allgather pass then circulates the finished chunks: at step t
// rank r sends chunk (r-t) and receives chunk (r-t-1).
//
// Each pass is one stream per direction: a step's bytes are forwarded as soon
// as the previous step's bytes have been received (and reduced), so the whole
// ring is pipelined at the granularity of socket reads. Every rank sends
// 2·(n-1)/n of the buffer in total, which is optimal.
//
// Determinism: chunk c is reduced once, along the ring starting at rank c+1,
// in the order ((x[c+1] op x[c+2]) op ...) op x[c], and then copied to
// everyone, so all ranks hold bitwise-identical results.
//
// Not thread-safe: runs on the progress thread.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/chunks.h"
#include "comm/scratch.h"
#include "comm/transport.h"
#include "lockstep/types.h"

namespace lockstep {

// After this, chunk transport.rank() of `acc` (elements of `dtype`) holds the
// reduction of all ranks' copies of it; other chunks hold partial results.
void ring_reduce_scatter(Transport& transport, const OpContext& op, void* acc, DType dtype, ReduceOp reduce_op,
                         const Chunks& chunks, Scratch& staging);

// On entry chunk transport.rank() of `buf` is final; afterwards every chunk is.
void ring_allgather(Transport& transport, const OpContext& op, void* buf, std::size_t elem_size, const Chunks& chunks);

}  // namespace lockstep
