// Reduce: a binomial tree for small messages; for large ones a ring
// reduce-scatter followed by every rank sending its finished chunk straight
// to the root. Works on a copy, so non-root buffers are left unchanged.
#include <vector>

#include "comm/accumulation.h"
#include "comm/algorithms/collectives.h"
#include "comm/algorithms/ring.h"
#include "comm/algorithms/root_agreement.h"
#include "comm/reduce_kernels.h"

namespace lockstep {
namespace {

// Binomial tree towards the root: in round k, ranks whose virtual rank has
// bit k set send their partial result to the rank without it and drop out.
void reduce_tree(Transport& transport, const OpContext& op, void* acc, std::size_t count, DType dtype, int root,
                 ReduceOp reduce_op, Scratch& staging) {
  const int n = transport.size();
  const int vrank = (transport.rank() - root + n) % n;
  const auto real_rank = [&](int v) { return (v + root) % n; };
  const std::size_t bytes = count * dtype_size(dtype);
  std::byte* incoming = staging.get(bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vrank & mask) {
      send_bytes(transport, op, real_rank(vrank - mask), acc, bytes);
      return;
    }
    if (vrank + mask < n) {
      recv_bytes(transport, op, real_rank(vrank + mask), incoming, bytes);
      reduce_into(acc, incoming, count, dtype, reduce_op);
    }
  }
}

}  // namespace

void TransportCollectives::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  const int n = transport_.size();
  const int r = transport_.rank();
  if (n == 1 || data.count == 0) return;
  check_root_agreement(transport_, op);
  const Accumulation acc = Accumulation::copy_of(data, accumulation_);

  if (data.count * dtype_size(acc.dtype()) <= small_bytes_) {
    reduce_tree(transport_, op, acc.data(), data.count, acc.dtype(), root, reduce_op, staging_);
    if (r == root) acc.finish(0, data.count, reduce_op, n, data.data);
    return;
  }

  const Chunks chunks(data.count, n);
  const std::size_t elem = dtype_size(data.dtype);
  ring_reduce_scatter(transport_, op, acc.data(), acc.dtype(), reduce_op, chunks, staging_);
  auto* out = static_cast<std::byte*>(data.data);
  if (r != root) {
    std::byte* packed = staging_.get(chunks.size(r) * elem);
    acc.finish(chunks.begin(r), chunks.size(r), reduce_op, n, packed);
    send_bytes(transport_, op, root, packed, chunks.size(r) * elem);
    return;
  }
  acc.finish(chunks.begin(r), chunks.size(r), reduce_op, n, out + chunks.begin(r) * elem);
  std::vector<BufferSink> sinks;
  sinks.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int c = 0; c < n; ++c) {
    if (c == root) continue;
    sinks.emplace_back(out + chunks.begin(c) * elem, chunks.size(c) * elem);
    channels.push_back({c, nullptr, &sinks.back()});
  }
  transport_.transfer(op, channels);
}

}  // namespace lockstep
