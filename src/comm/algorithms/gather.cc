// Gather and scatter: the root talks to every other rank at once (one
// channel each; transfer() moves them together), so the root's link is the
// only bottleneck, as in a linear MPI gather.
#include <cstring>
#include <vector>

#include "comm/algorithms/collectives.h"
#include "comm/algorithms/root_agreement.h"

namespace lockstep {

void TransportCollectives::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  const int n = transport_.size();
  const std::size_t bytes = input.bytes();
  auto* out = static_cast<std::byte*>(output.data);
  if (transport_.rank() == root && bytes > 0)
    std::memmove(out + static_cast<std::size_t>(root) * bytes, input.data, bytes);
  if (n == 1 || bytes == 0) return;
  check_root_agreement(transport_, op);
  if (transport_.rank() != root) return send_bytes(transport_, op, root, input.data, bytes);
  std::vector<BufferSink> sinks;
  sinks.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int q = 0; q < n; ++q) {
    if (q == root) continue;
    sinks.emplace_back(out + static_cast<std::size_t>(q) * bytes, bytes);
    channels.push_back({q, nullptr, &sinks.back()});
  }
  transport_.transfer(op, channels);
}

void TransportCollectives::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  const int n = transport_.size();
  const std::size_t bytes = output.bytes();
  const auto* in = static_cast<const std::byte*>(input.data);
  if (transport_.rank() == root && bytes > 0)
    std::memmove(output.data, in + static_cast<std::size_t>(root) * bytes, bytes);
  if (n == 1 || bytes == 0) return;
  check_root_agreement(transport_, op);
  if (transport_.rank() != root) return recv_bytes(transport_, op, root, output.data, bytes);
  std::vector<BufferSource> sources;
  sources.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int q = 0; q < n; ++q) {
    if (q == root) continue;
    sources.emplace_back(in + static_cast<std::size_t>(q) * bytes, bytes);
    channels.push_back({q, &sources.back(), nullptr});
  }
  transport_.transfer(op, channels);
}

}  // namespace lockstep
