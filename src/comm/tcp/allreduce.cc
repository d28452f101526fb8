// tcp allreduce: recursive doubling for small messages, ring reduce-scatter
// + allgather for large ones (see tcp_backend.h for the crossover).
#include "comm/reduce_kernels.h"
#include "comm/tcp/ring.h"
#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"

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
    allreduce_recursive_doubling(op, acc, data.count, acc_type, reduce_op);
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

// Recursive doubling. With p the largest power of two <= n and e = n - p,
// ranks 0..2e-1 pair up first: each even rank hands its data to the odd rank
// above it and waits for the result. The p remaining ranks (the odd ones
// among the first 2e, then all ranks from 2e up; "virtual ranks" 0..p-1)
// exchange with the partner whose virtual rank differs in one bit per round.
// Partners combine as op(lower rank's data, higher rank's data), so both get
// the same bits.
void TcpBackend::allreduce_recursive_doubling(const OpContext& op, void* acc, std::size_t count, DType dtype,
                                              ReduceOp reduce_op) {
  const int n = mesh_.size();
  const int r = mesh_.rank();
  const std::size_t bytes = count * dtype_size(dtype);
  std::byte* incoming = staging_.get(bytes);
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;

  int vrank = r - extra;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      send_bytes(mesh_, op, r + 1, acc, bytes);
      recv_bytes(mesh_, op, r + 1, acc, bytes);
      return;
    }
    recv_bytes(mesh_, op, r - 1, incoming, bytes);
    reduce_into(acc, incoming, count, dtype, reduce_op, /*src_first=*/true);
    vrank = r / 2;
  }
  const auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int mask = 1; mask < pow2; mask <<= 1) {
    const int partner = real_rank(vrank ^ mask);
    exchange(mesh_, op, partner, acc, bytes, incoming, bytes);
    reduce_into(acc, incoming, count, dtype, reduce_op, /*src_first=*/partner < r);
  }
  if (r < 2 * extra) send_bytes(mesh_, op, r - 1, acc, bytes);
}

}  // namespace lockstep
