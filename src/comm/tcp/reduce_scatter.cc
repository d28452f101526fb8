// tcp reduce_scatter: one ring reduce-scatter pass over a working copy of the
// input (fp32 for 16-bit types), then this rank's block is finished (avg,
// rounding) into the output.
#include <cstring>

#include "comm/reduce_kernels.h"
#include "comm/algorithms/ring.h"
#include "comm/tcp/tcp_backend.h"

namespace lockstep {

void TcpBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  const int n = mesh_.size();
  const int r = mesh_.rank();
  const std::size_t total = input.count;
  if (total == 0) return;
  const DType acc_type = accumulation_dtype(input.dtype);
  const std::size_t acc_elem = dtype_size(acc_type);
  auto* acc = accumulation_.get(total * acc_elem);
  if (acc_type != input.dtype)
    widen_to_f32(input.data, reinterpret_cast<float*>(acc), total, input.dtype);
  else
    std::memcpy(acc, input.data, input.bytes());

  const Chunks chunks(total, n);
  ring_reduce_scatter(mesh_, op, acc, acc_type, reduce_op, chunks, staging_);
  std::byte* own = acc + chunks.begin(r) * acc_elem;
  if (reduce_op == ReduceOp::avg) divide_by(own, output.count, acc_type, n);
  if (acc_type != input.dtype)
    narrow_from_f32(reinterpret_cast<const float*>(own), output.data, output.count, output.dtype);
  else
    std::memcpy(output.data, own, output.bytes());
}

}  // namespace lockstep
