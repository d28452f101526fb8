// tcp reduce: a binomial tree for small messages; for large ones a ring
// reduce-scatter followed by every rank sending its finished chunk straight
// to the root. Works on a copy, so non-root buffers are left unchanged.
#include <cstring>
#include <vector>

#include "comm/reduce_kernels.h"
#include "comm/algorithms/ring.h"
#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"

namespace lockstep {

void TcpBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  const int n = mesh_.size();
  const int r = mesh_.rank();
  if (n == 1 || data.count == 0) return;
  check_agreement_around_the_ring(op);
  const DType acc_type = accumulation_dtype(data.dtype);
  const bool widened = acc_type != data.dtype;
  const std::size_t acc_elem = dtype_size(acc_type);
  const std::size_t elem = dtype_size(data.dtype);
  auto* acc = accumulation_.get(data.count * acc_elem);
  if (widened)
    widen_to_f32(data.data, reinterpret_cast<float*>(acc), data.count, data.dtype);
  else
    std::memcpy(acc, data.data, data.bytes());

  // Writes `count` finished elements at acc[begin] to dst in the data's type.
  const auto finish = [&](std::size_t begin, std::size_t count, void* dst) {
    std::byte* src = acc + begin * acc_elem;
    if (reduce_op == ReduceOp::avg) divide_by(src, count, acc_type, n);
    if (widened)
      narrow_from_f32(reinterpret_cast<const float*>(src), dst, count, data.dtype);
    else
      std::memcpy(dst, src, count * elem);
  };

  if (data.count * acc_elem <= small_bytes_) {
    reduce_tree(op, acc, data.count, acc_type, root, reduce_op);
    if (r == root) finish(0, data.count, data.data);
    return;
  }

  const Chunks chunks(data.count, n);
  ring_reduce_scatter(mesh_, op, acc, acc_type, reduce_op, chunks, staging_);
  auto* out = static_cast<std::byte*>(data.data);
  if (r != root) {
    std::byte* packed = staging_.get(chunks.size(r) * elem);
    finish(chunks.begin(r), chunks.size(r), packed);
    send_bytes(mesh_, op, root, packed, chunks.size(r) * elem);
    return;
  }
  finish(chunks.begin(r), chunks.size(r), out + chunks.begin(r) * elem);
  std::vector<BufferSink> sinks;
  sinks.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int c = 0; c < n; ++c) {
    if (c == root) continue;
    sinks.emplace_back(out + chunks.begin(c) * elem, chunks.size(c) * elem);
    channels.push_back({c, nullptr, &sinks.back()});
  }
  run_transfer(mesh_, op, channels);
}

// Binomial tree towards the root: in round k, ranks whose virtual rank has
// bit k set send their partial result to the rank without it and drop out.
void TcpBackend::reduce_tree(const OpContext& op, void* acc, std::size_t count, DType dtype, int root,
                             ReduceOp reduce_op) {
  const int n = mesh_.size();
  const int vrank = (mesh_.rank() - root + n) % n;
  const auto real_rank = [&](int v) { return (v + root) % n; };
  const std::size_t bytes = count * dtype_size(dtype);
  std::byte* incoming = staging_.get(bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vrank & mask) {
      send_bytes(mesh_, op, real_rank(vrank - mask), acc, bytes);
      return;
    }
    if (vrank + mask < n) {
      recv_bytes(mesh_, op, real_rank(vrank + mask), incoming, bytes);
      reduce_into(acc, incoming, count, dtype, reduce_op);
    }
  }
}

}  // namespace lockstep
