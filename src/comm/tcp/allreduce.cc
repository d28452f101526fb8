// tcp allreduce: recursive doubling for small messages, ring reduce-scatter
// + allgather for large ones (see tcp_backend.h for the crossover), the
// shared algorithms of algorithms/ over the mesh.
#include "comm/algorithms/allreduce.h"
#include "comm/algorithms/ring.h"
#include "comm/reduce_kernels.h"
#include "comm/tcp/tcp_backend.h"

namespace lockstep {

void TcpBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  const int n = mesh_.size();
  if (n == 1 || data.count == 0) return;
  const DType acc_type = accumulation_dtype(data.dtype);
  const bool widened = acc_type != data.dtype;
  void* acc = data.data;
  if (widened) {
    acc = accumulation_.get(data.count * sizeof(float));
    widen_to_f32(data.data, static_cast<float*>(acc), data.count, data.dtype);
  }

  if (data.count * dtype_size(acc_type) <= small_bytes_) {
    allreduce_recursive_doubling(mesh_, op, acc, data.count, acc_type, reduce_op, staging_);
    if (reduce_op == ReduceOp::avg) divide_by(acc, data.count, acc_type, n);
    if (widened) narrow_from_f32(static_cast<float*>(acc), data.data, data.count, data.dtype);
    return;
  }

  const Chunks chunks(data.count, n);
  const int r = mesh_.rank();
  ring_reduce_scatter(mesh_, op, acc, acc_type, reduce_op, chunks, staging_);
  // This rank's chunk is final: finish avg, round 16-bit once, then share it.
  auto* own = static_cast<std::byte*>(acc) + chunks.begin(r) * dtype_size(acc_type);
  if (reduce_op == ReduceOp::avg) divide_by(own, chunks.size(r), acc_type, n);
  if (widened)
    narrow_from_f32(reinterpret_cast<const float*>(own),
                    static_cast<std::byte*>(data.data) + chunks.begin(r) * dtype_size(data.dtype), chunks.size(r),
                    data.dtype);
  ring_allgather(mesh_, op, data.data, dtype_size(data.dtype), chunks);
}

}  // namespace lockstep
