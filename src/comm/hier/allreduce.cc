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
#include <cstring>

#include "comm/algorithms/allreduce.h"
#include "comm/hier/hier_backend.h"
#include "comm/reduce_kernels.h"

namespace lockstep {

void HierBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  if (!hierarchical()) return flat_.allreduce(op, data, reduce_op);
  if (data.count == 0) return;
  const DType acc_type = accumulation_dtype(data.dtype);
  const bool widened = acc_type != data.dtype;
  const std::size_t acc_elem = dtype_size(acc_type);
  const std::size_t elem = dtype_size(data.dtype);
  const auto local_size = static_cast<std::size_t>(layout_.local_size());
  const std::size_t shard = (data.count + local_size - 1) / local_size;
  const std::size_t padded = shard * local_size;
  const ReduceOp kernel_op = reduce_op == ReduceOp::avg ? ReduceOp::sum : reduce_op;

  // Step 1.
  std::byte* input = static_cast<std::byte*>(data.data);
  if (widened || padded != data.count) {
    input = padded_.get(padded * acc_elem);
    if (widened)
      widen_to_f32(data.data, reinterpret_cast<float*>(input), data.count, data.dtype);
    else
      std::memcpy(input, data.data, data.bytes());
    std::memset(input + data.count * acc_elem, 0, (padded - data.count) * acc_elem);
  }
  std::byte* own = input;  // alone on the host: the whole buffer is the shard
  if (local_) {
    own = shard_.get(shard * acc_elem);
    local_->reduce_scatter(op, ConstBuffer(input, padded, acc_type), Buffer{own, shard, acc_type}, kernel_op);
  }

  // Step 2.
  allreduce_accumulated(*across_, op, own, shard, acc_type, kernel_op, flat_.small_bytes(), staging_);
  if (reduce_op == ReduceOp::avg) divide_by(own, shard, acc_type, size_);
  if (widened) {
    std::byte* rounded = narrow_.get(shard * elem);
    narrow_from_f32(reinterpret_cast<const float*>(own), rounded, shard, data.dtype);
    own = rounded;
  }

  // Step 3.
  if (!local_) {
    if (own != data.data) std::memcpy(data.data, own, data.bytes());
    return;
  }
  std::byte* output = padded == data.count ? static_cast<std::byte*>(data.data) : gathered_.get(padded * elem);
  local_->allgather(op, ConstBuffer(own, shard, data.dtype), Buffer{output, padded, data.dtype});
  if (output != data.data) std::memcpy(data.data, output, data.bytes());
}

}  // namespace lockstep
