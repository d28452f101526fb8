// Recursive doubling and the ring allreduce over a Transport; see allreduce.h.
#include "comm/algorithms/allreduce.h"

#include "comm/accumulation.h"
#include "comm/algorithms/collectives.h"
#include "comm/algorithms/ring.h"
#include "comm/chunks.h"
#include "comm/reduce_kernels.h"

namespace lockstep {

// With p the largest power of two <= n and e = n - p, ranks 0..2e-1 pair up
// first: each even rank hands its data to the odd rank above it and waits
// for the result. The p remaining ranks (the odd ones among the first 2e,
// then all ranks from 2e up; "virtual ranks" 0..p-1) exchange with the
// partner whose virtual rank differs in one bit per round. Partners combine
// as op(lower rank's data, higher rank's data), so both get the same bits.
void allreduce_recursive_doubling(Transport& transport, const OpContext& op, void* acc, std::size_t count,
                                  DType dtype, ReduceOp reduce_op, Scratch& staging) {
  const int n = transport.size();
  const int r = transport.rank();
  if (n == 1 || count == 0) return;
  const std::size_t bytes = count * dtype_size(dtype);
  std::byte* incoming = staging.get(bytes);
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;

  int vrank = r - extra;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      send_bytes(transport, op, r + 1, acc, bytes);
      recv_bytes(transport, op, r + 1, acc, bytes);
      return;
    }
    recv_bytes(transport, op, r - 1, incoming, bytes);
    reduce_into(acc, incoming, count, dtype, reduce_op, /*src_first=*/true);
    vrank = r / 2;
  }
  const auto real_rank = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int mask = 1; mask < pow2; mask <<= 1) {
    const int partner = real_rank(vrank ^ mask);
    exchange(transport, op, partner, acc, bytes, incoming, bytes);
    reduce_into(acc, incoming, count, dtype, reduce_op, /*src_first=*/partner < r);
  }
  if (r < 2 * extra) send_bytes(transport, op, r - 1, acc, bytes);
}

void allreduce_accumulated(Transport& transport, const OpContext& op, void* acc, std::size_t count, DType dtype,
                           ReduceOp reduce_op, std::size_t small_bytes, Scratch& staging) {
  if (transport.size() == 1 || count == 0) return;
  if (count * dtype_size(dtype) <= small_bytes)
    return allreduce_recursive_doubling(transport, op, acc, count, dtype, reduce_op, staging);
  const Chunks chunks(count, transport.size());
  ring_reduce_scatter(transport, op, acc, dtype, reduce_op, chunks, staging);
  ring_allgather(transport, op, acc, dtype_size(dtype), chunks);
}

// The whole collective on the caller's data: reduced in its accumulation
// type; on the ring, each rank finishes (avg, rounding) only its own chunk,
// and the allgather pass then moves the finished chunks in the caller's
// type (half the bytes for 16-bit data).
void TransportCollectives::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  const int n = transport_.size();
  if (n == 1 || data.count == 0) return;
  const Accumulation acc = Accumulation::in_place(data, accumulation_);
  if (data.count * dtype_size(acc.dtype()) <= small_bytes_) {
    allreduce_recursive_doubling(transport_, op, acc.data(), data.count, acc.dtype(), reduce_op, staging_);
    acc.finish(0, data.count, reduce_op, n, data.data);
    return;
  }
  const Chunks chunks(data.count, n);
  const int r = transport_.rank();
  ring_reduce_scatter(transport_, op, acc.data(), acc.dtype(), reduce_op, chunks, staging_);
  acc.finish(chunks.begin(r), chunks.size(r), reduce_op, n,
             static_cast<std::byte*>(data.data) + chunks.begin(r) * dtype_size(data.dtype));
  ring_allgather(transport_, op, data.data, dtype_size(data.dtype), chunks);
}

}  // namespace lockstep
