// all_to_all, and allgather with per-rank counts: every rank sends to
// and receives from every other rank at once, one channel per peer, so
// transfer() keeps all links busy. A block of zero elements still
// travels as its stamp, so both sides of every pair take part alike.
#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/collectives.h"

namespace lockstep {

void TransportCollectives::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  const int n = transport_.size();
  const int r = transport_.rank();
  const std::size_t elem = dtype_size(input.dtype);
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  if (counts.send_count(r) > 0)
    std::memcpy(out + counts.recv_offset(r) * elem, in + counts.send_offset(r) * elem, counts.send_count(r) * elem);
  if (n == 1 || counts.max_block() == 0) return;
  std::vector<BufferSource> sources;
  std::vector<BufferSink> sinks;
  sources.reserve(static_cast<std::size_t>(n));
  sinks.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int i = 1; i < n; ++i) {
    const int q = (r + i) % n;
    sources.emplace_back(in + counts.send_offset(q) * elem, counts.send_count(q) * elem);
    sinks.emplace_back(out + counts.recv_offset(q) * elem, counts.recv_count(q) * elem);
    channels.push_back({q, &sources.back(), &sinks.back()});
  }
  transport_.transfer(op, channels);
}

void TransportCollectives::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                             const std::vector<std::size_t>& counts) {
  const int n = transport_.size();
  const int r = transport_.rank();
  const std::size_t elem = dtype_size(input.dtype);
  auto* out = static_cast<std::byte*>(output.data);
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) offsets[q + 1] = offsets[q] + counts[q];
  if (input.bytes() > 0) std::memmove(out + offsets[static_cast<std::size_t>(r)] * elem, input.data, input.bytes());
  if (n == 1 || *std::max_element(counts.begin(), counts.end()) == 0) return;
  // Every peer gets the same bytes: one source per channel over the input.
  std::vector<BufferSource> sources;
  std::vector<BufferSink> sinks;
  sources.reserve(static_cast<std::size_t>(n));
  sinks.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int i = 1; i < n; ++i) {
    const int q = (r + i) % n;
    const auto uq = static_cast<std::size_t>(q);
    sources.emplace_back(input.data, input.bytes());
    sinks.emplace_back(out + offsets[uq] * elem, counts[uq] * elem);
    channels.push_back({q, &sources.back(), &sinks.back()});
  }
  transport_.transfer(op, channels);
}

}  // namespace lockstep
