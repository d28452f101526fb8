// hier reduce_scatter, in two steps on a copy of the input in its
// accumulation type, with the blocks laid out by local rank (the order of
// HostLayout::by_local_rank):
//   1. inside the host: an shm reduce-scatter leaves local rank l with the
//      host's sum of the blocks of every rank of local rank l;
//   2. across hosts: a ring reduce-scatter of those among the ranks of
//      local rank l leaves each with its own block, summed over every rank;
//      avg divides by the group size and 16-bit types round, once.
// The wire carries what allgather's does (allgather.cc), in reverse.
//
// Pipelined (pipeline.h) from 2 x kPipelinePieceBytes of input up: piece k
// is the same slice of every block, so the wire carries piece k while this
// thread runs step 1 of piece k+1.
#include "comm/accumulation.h"
#include "comm/algorithms/ring.h"
#include "comm/hier/hier_backend.h"
#include "comm/hier/pipeline.h"
#include "comm/reduce_kernels.h"

namespace lockstep {

void HierBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  if (!hierarchical() || !local_ || output.count == 0) return flat_.reduce_scatter(op, input, output, reduce_op);
  const auto hosts = static_cast<std::size_t>(layout_.hosts);
  const std::size_t count = output.count;
  const DType acc_type = accumulation_dtype(input.dtype);
  const std::size_t acc_elem = dtype_size(acc_type);
  const std::size_t elem = dtype_size(input.dtype);
  const ReduceOp kernel_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  const std::size_t pieces = std::min(pipeline_pieces(input.bytes()), count);
  const Chunks slices(count, static_cast<int>(pieces));
  const auto first = [&](std::size_t k) { return slices.begin(static_cast<int>(k)); };
  const auto slice = [&](std::size_t k) { return slices.size(static_cast<int>(k)); };
  // Piece k's laid-out copy (every block's slice) and its row (this local
  // rank's blocks, one per host), each from the same element offset of
  // its scratch as the slice in a block, times the blocks it holds.
  std::byte* laid_out = padded_.get(input.count * acc_elem);
  std::byte* rows = shard_.get(hosts * count * acc_elem);
  const auto blocks = layout_.by_local_rank.size();
  const auto laid_out_piece = [&](std::size_t k) { return laid_out + blocks * first(k) * acc_elem; };
  const auto row = [&](std::size_t k) { return rows + hosts * first(k) * acc_elem; };

  PipelineSteps steps;
  steps.before = [&](std::size_t k) {
    const std::size_t n = slice(k);
    const auto* in = static_cast<const std::byte*>(input.data) + first(k) * elem;
    for (std::size_t i = 0; i < blocks; ++i)
      copy_to_accumulation_type(in + static_cast<std::size_t>(layout_.by_local_rank[i]) * count * elem, n,
                                input.dtype, laid_out_piece(k) + i * n * acc_elem);
    local_->reduce_scatter(op, ConstBuffer(laid_out_piece(k), blocks * n, acc_type), Buffer{row(k), hosts * n, acc_type},
                           kernel_op);
  };
  steps.across = [&](const OpContext& across_op, std::size_t k) {
    const std::size_t n = slice(k);
    const Chunks per_host(hosts * n, layout_.hosts);
    ring_reduce_scatter(*across_, across_op, row(k), acc_type, kernel_op, per_host, staging_);
    auto* out = static_cast<std::byte*>(output.data) + first(k) * elem;
    Accumulation::of_accumulated(row(k), acc_type, input.dtype)
        .finish(per_host.begin(across_->rank()), n, reduce_op, size_, out);
  };
  run_pipeline(op, pieces, steps);
}

}  // namespace lockstep
