// hier allgather, in two steps:
//   1. across hosts: the ranks with this rank's local rank gather their
//      inputs (the shared ring allgather over the cross-host ring), into
//      this local rank's row of a scratch table (local rank x host);
//   2. inside the host: an shm allgather of the rows fills the table, and
//      every block is copied to its rank's place in the output.
// Each host sends its ranks' inputs across the wire once to each other
// host: (hosts - 1) x local size blocks per host, where the flat ring over
// every rank carries (ranks - 1) blocks over each host boundary (1.5x more
// at 2 hosts x 2 ranks; docs/algorithms.md).
//
// Pipelined (pipeline.h) from 2 x kPipelinePieceBytes of output up: piece
// k is the same slice of every rank's block, so the wire carries piece k
// while this thread runs step 2 of piece k-1.
#include <cstring>

#include "comm/chunks.h"
#include "comm/hier/hier_backend.h"
#include "comm/hier/pipeline.h"

namespace lockstep {

void HierBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  if (!hierarchical() || !local_ || input.count == 0) return flat_.allgather(op, input, output);
  const auto hosts = static_cast<std::size_t>(layout_.hosts);
  const auto local_size = static_cast<std::size_t>(layout_.local_size());
  const std::size_t elem = dtype_size(input.dtype);
  const std::size_t pieces = std::min(pipeline_pieces(output.bytes()), input.count);
  const Chunks slices(input.count, static_cast<int>(pieces));
  // Piece k's table: hosts x local size blocks of its slice, from element
  // hosts x local size x slices.begin(k) of the scratch.
  std::byte* tables = gathered_.get(hosts * local_size * input.bytes());
  const auto table = [&](std::size_t k) { return tables + hosts * local_size * slices.begin(static_cast<int>(k)) * elem; };
  const auto slice = [&](std::size_t k) { return slices.size(static_cast<int>(k)); };
  const auto own_row = [&](std::size_t k) {
    return table(k) + static_cast<std::size_t>(layout_.local_rank) * hosts * slice(k) * elem;
  };

  PipelineSteps steps;
  steps.across = [&](const OpContext& across_op, std::size_t k) {
    const auto* in = static_cast<const std::byte*>(input.data) + slices.begin(static_cast<int>(k)) * elem;
    across_collectives_->allgather(across_op, ConstBuffer(in, slice(k), input.dtype),
                                   Buffer{own_row(k), hosts * slice(k), input.dtype});
  };
  steps.after = [&](std::size_t k) {
    const std::size_t n = slice(k);
    local_->allgather(op, ConstBuffer(own_row(k), hosts * n, input.dtype),
                      Buffer{table(k), local_size * hosts * n, input.dtype});
    auto* out = static_cast<std::byte*>(output.data) + slices.begin(static_cast<int>(k)) * elem;
    for (std::size_t i = 0; i < layout_.by_local_rank.size(); ++i)
      std::memcpy(out + static_cast<std::size_t>(layout_.by_local_rank[i]) * input.bytes(), table(k) + i * n * elem,
                  n * elem);
  };
  run_pipeline(op, pieces, steps);
}

}  // namespace lockstep
