// tcp gather and scatter: the root talks to every other rank at once (one
// channel each over the mesh; run_transfer moves them together), so the
// root's link is the only bottleneck, as in a linear MPI gather.
#include <cstring>
#include <vector>

#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"

namespace lockstep {

void TcpBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  const int n = mesh_.size();
  const std::size_t bytes = input.bytes();
  auto* out = static_cast<std::byte*>(output.data);
  if (mesh_.rank() == root && bytes > 0) std::memmove(out + static_cast<std::size_t>(root) * bytes, input.data, bytes);
  if (n == 1 || bytes == 0) return;
  check_agreement_around_the_ring(op);
  if (mesh_.rank() != root) return send_bytes(mesh_, op, root, input.data, bytes);
  std::vector<BufferSink> sinks;
  sinks.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int q = 0; q < n; ++q) {
    if (q == root) continue;
    sinks.emplace_back(out + static_cast<std::size_t>(q) * bytes, bytes);
    channels.push_back({q, nullptr, &sinks.back()});
  }
  run_transfer(mesh_, op, channels);
}

void TcpBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  const int n = mesh_.size();
  const std::size_t bytes = output.bytes();
  const auto* in = static_cast<const std::byte*>(input.data);
  if (mesh_.rank() == root && bytes > 0) std::memmove(output.data, in + static_cast<std::size_t>(root) * bytes, bytes);
  if (n == 1 || bytes == 0) return;
  check_agreement_around_the_ring(op);
  if (mesh_.rank() != root) return recv_bytes(mesh_, op, root, output.data, bytes);
  std::vector<BufferSource> sources;
  sources.reserve(static_cast<std::size_t>(n));
  std::vector<Channel> channels;
  for (int q = 0; q < n; ++q) {
    if (q == root) continue;
    sources.emplace_back(in + static_cast<std::size_t>(q) * bytes, bytes);
    channels.push_back({q, &sources.back(), nullptr});
  }
  run_transfer(mesh_, op, channels);
}

}  // namespace lockstep
