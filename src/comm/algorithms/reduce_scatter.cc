// reduce_scatter: one ring reduce-scatter pass over a working copy of the
// input (fp32 for 16-bit types), then this rank's block is finished (avg,
// rounding) into the output.
#include "comm/accumulation.h"
#include "comm/algorithms/collectives.h"
#include "comm/algorithms/ring.h"

namespace lockstep {

void TransportCollectives::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output,
                                          ReduceOp reduce_op) {
  const int n = transport_.size();
  const int r = transport_.rank();
  if (input.count == 0) return;
  const Accumulation acc = Accumulation::copy_of(input, accumulation_);
  const Chunks chunks(input.count, n);
  ring_reduce_scatter(transport_, op, acc.data(), acc.dtype(), reduce_op, chunks, staging_);
  acc.finish(chunks.begin(r), output.count, reduce_op, n, output.data);
}

}  // namespace lockstep
