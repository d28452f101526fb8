// hier allreduce, in three steps (hier_backend.h):
//   1. reduce-scatter inside the host (shm): local rank l ends with shard l
//      of its host's sum. The data is taken in its accumulation type (fp32
//      for 16-bit types) and padded to a multiple of the local size, so the
//      shards are equal; what the padding holds is reduced and dropped.
//   2. allreduce of shard l across hosts, among the ranks with local rank l
//      (the shared recursive doubling or ring over the tcp mesh): shard l is
//      now final on every host, with the same bits everywhere; avg divides
//      by the group size here, 16-bit types round here, once.
//   3. allgather of the finished shards inside the host (shm).
// Each host sends its data across the wire once, not once per rank.
//
// Pipelined: a large buffer is cut into pieces that go through the steps
// one after another, step 2 on a worker thread, so the wire carries piece i
// while this thread runs step 1 of piece i+1 and step 3 of piece i-1. Every
// rank of a host issues its shm steps in the same fixed order (1 of i, then
// 3 of i-1), so they always meet. Cutting changes no result: each element
// is reduced by the same ranks in the same order as without pieces.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/accumulation.h"
#include "comm/algorithms/allreduce.h"
#include "comm/hier/hier_backend.h"
#include "comm/hier/pipeline.h"
#include "comm/reduce_kernels.h"

namespace lockstep {
namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }
std::size_t round_up(std::size_t a, std::size_t multiple) { return ceil_div(a, multiple) * multiple; }

}  // namespace

// Where one piece's data and scratch lie.
struct HierBackend::Piece {
  Buffer data;               // the caller's elements of this piece
  std::size_t shard = 0;     // elements per local rank (padded count / local size)
  std::byte* input = nullptr;     // step 1's input: data, or its widened/padded copy
  std::byte* own = nullptr;       // this rank's shard in the accumulation type
  std::byte* finished = nullptr;  // the finished shard in the caller's type
  std::byte* gathered = nullptr;  // step 3's output: data, or a padded copy
};

std::size_t HierBackend::pipeline_pieces(std::size_t bytes) const {
  if (!local_ || bytes < 2 * kPipelinePieceBytes) return 1;
  return std::min(kPipelineMaxPieces, bytes / kPipelinePieceBytes);
}

void HierBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  if (!hierarchical()) return flat_.allreduce(op, data, reduce_op);
  if (data.count == 0) return;
  const DType acc_type = accumulation_dtype(data.dtype);
  const std::size_t acc_elem = dtype_size(acc_type);
  const std::size_t elem = dtype_size(data.dtype);
  const auto local_size = static_cast<std::size_t>(layout_.local_size());

  // Pieces of `per_piece` elements (a multiple of the local size, so only
  // the last may need padding); scratch is laid out in slots of that size.
  const bool widened = acc_type != data.dtype;
  const std::size_t wanted = pipeline_pieces(data.bytes());
  const std::size_t per_piece = round_up(ceil_div(data.count, wanted), local_size);
  const std::size_t pieces = ceil_div(data.count, per_piece);
  const std::size_t slot_shard = per_piece / local_size;
  const bool inexact = data.count % local_size != 0;  // the last piece is padded
  std::byte* padded = widened || inexact ? padded_.get(pieces * per_piece * acc_elem) : nullptr;
  std::byte* shards = local_ ? shard_.get(pieces * slot_shard * acc_elem) : nullptr;
  std::byte* narrowed = widened ? narrow_.get(pieces * slot_shard * elem) : nullptr;
  std::byte* gathered = inexact ? gathered_.get(per_piece * elem) : nullptr;  // the last piece only

  std::vector<Piece> plan(pieces);
  for (std::size_t i = 0; i < pieces; ++i) {
    Piece& p = plan[i];
    const std::size_t first = i * per_piece;
    const std::size_t count = std::min(per_piece, data.count - first);
    p.data = Buffer{static_cast<std::byte*>(data.data) + first * elem, count, data.dtype};
    p.shard = ceil_div(count, local_size);
    const bool exact = p.shard * local_size == count;
    p.input = widened || !exact ? padded + i * per_piece * acc_elem : static_cast<std::byte*>(p.data.data);
    p.own = local_ ? shards + i * slot_shard * acc_elem : p.input;
    p.finished = widened ? narrowed + i * slot_shard * elem : p.own;
    p.gathered = exact ? static_cast<std::byte*>(p.data.data) : gathered;
  }

  run_pipeline(op, pieces,
               {[&](std::size_t i) { reduce_inside_host(op, plan[i], reduce_op); },
                [&](const OpContext& across_op, std::size_t i) { reduce_across_hosts(across_op, plan[i], reduce_op); },
                [&](std::size_t i) { gather_inside_host(op, plan[i]); }});
}

// Step 1.
void HierBackend::reduce_inside_host(const OpContext& op, Piece& p, ReduceOp reduce_op) {
  const DType acc_type = accumulation_dtype(p.data.dtype);
  const std::size_t acc_elem = dtype_size(acc_type);
  const std::size_t padded = p.shard * static_cast<std::size_t>(layout_.local_size());
  if (p.input != p.data.data) {
    copy_to_accumulation_type(p.data.data, p.data.count, p.data.dtype, p.input);
    std::memset(p.input + p.data.count * acc_elem, 0, (padded - p.data.count) * acc_elem);
  }
  if (!local_) return;  // alone on the host: the whole buffer is the shard
  const ReduceOp kernel_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  local_->reduce_scatter(op, ConstBuffer(p.input, padded, acc_type), Buffer{p.own, p.shard, acc_type}, kernel_op);
}

// Step 2: on the worker thread when pipelined; it touches only the piece,
// the cross-host transport and staging_.
void HierBackend::reduce_across_hosts(const OpContext& op, Piece& p, ReduceOp reduce_op) {
  const DType acc_type = accumulation_dtype(p.data.dtype);
  const ReduceOp kernel_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  allreduce_accumulated(*across_, op, p.own, p.shard, acc_type, kernel_op, flat_.small_bytes(), staging_);
  Accumulation::of_accumulated(p.own, acc_type, p.data.dtype).finish(0, p.shard, reduce_op, size_, p.finished);
}

// Step 3.
void HierBackend::gather_inside_host(const OpContext& op, Piece& p) {
  if (!local_) {
    if (p.finished != p.data.data) std::memcpy(p.data.data, p.finished, p.data.bytes());
    return;
  }
  const std::size_t padded = p.shard * static_cast<std::size_t>(layout_.local_size());
  local_->allgather(op, ConstBuffer(p.finished, p.shard, p.data.dtype), Buffer{p.gathered, padded, p.data.dtype});
  if (p.gathered != p.data.data) std::memcpy(p.data.data, p.gathered, p.data.bytes());
}

}  // namespace lockstep
