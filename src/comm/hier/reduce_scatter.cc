// hier reduce_scatter, in two steps on a copy of the input in its
// accumulation type, with the blocks laid out by local rank (the order of
// HostLayout::by_local_rank):
//   1. inside the host: an shm reduce-scatter leaves local rank l with the
//      host's sum of the blocks of every rank of local rank l;
//   2. across hosts: a ring reduce-scatter of those among the ranks of
//      local rank l leaves each with its own block, summed over every rank;
//   then avg divides by the group size and 16-bit types round, once.
// The wire carries what allgather's does (allgather.cc), in reverse.
#include <cstring>

#include "comm/accumulation.h"
#include "comm/algorithms/ring.h"
#include "comm/hier/hier_backend.h"
#include "comm/reduce_kernels.h"

namespace lockstep {

void HierBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  if (!hierarchical() || !local_ || output.count == 0) return flat_.reduce_scatter(op, input, output, reduce_op);
  const auto hosts = static_cast<std::size_t>(layout_.hosts);
  const std::size_t count = output.count;
  const DType acc_type = accumulation_dtype(input.dtype);
  const std::size_t acc_block = count * dtype_size(acc_type);
  const std::size_t in_block = count * dtype_size(input.dtype);

  std::byte* laid_out = padded_.get(input.count * dtype_size(acc_type));
  const auto* in = static_cast<const std::byte*>(input.data);
  for (std::size_t i = 0; i < layout_.by_local_rank.size(); ++i)
    copy_to_accumulation_type(in + static_cast<std::size_t>(layout_.by_local_rank[i]) * in_block, count,
                              input.dtype, laid_out + i * acc_block);

  const ReduceOp kernel_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;
  std::byte* row = shard_.get(hosts * acc_block);
  local_->reduce_scatter(op, ConstBuffer(laid_out, input.count, acc_type), Buffer{row, hosts * count, acc_type},
                         kernel_op);
  const Chunks chunks(hosts * count, layout_.hosts);
  ring_reduce_scatter(*across_, op, row, acc_type, kernel_op, chunks, staging_);
  const Accumulation acc = Accumulation::of_accumulated(row, acc_type, input.dtype);
  acc.finish(chunks.begin(across_->rank()), count, reduce_op, size_, output.data);
}

}  // namespace lockstep
