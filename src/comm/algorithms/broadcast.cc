// Binomial-tree and chain broadcast over a Transport; see broadcast.h.
#include "comm/algorithms/broadcast.h"

#include "comm/algorithms/collectives.h"
#include "comm/algorithms/root_agreement.h"

namespace lockstep {
namespace {

// Sends what a sink has received so far: the forwarding half of a chain.
class ForwardSource final : public ByteSource {
 public:
  ForwardSource(const BufferSink& sink, const std::byte* data, std::size_t len) : sink_(sink), data_(data), len_(len) {}
  std::span<const std::byte> ready() override { return {data_ + sent_, sink_.received() - sent_}; }
  void consumed(std::size_t n) override { sent_ += n; }
  bool finished() const override { return sent_ == len_; }

 private:
  const BufferSink& sink_;
  const std::byte* data_;
  std::size_t len_;
  std::size_t sent_ = 0;
};

}  // namespace

void broadcast_tree(Transport& transport, const OpContext& op, void* data, std::size_t bytes, int root) {
  const int n = transport.size();
  const int vrank = (transport.rank() - root + n) % n;
  const auto real_rank = [&](int v) { return (v + root) % n; };
  int mask = 1;
  while (mask < n) {
    if (vrank & mask) {
      recv_bytes(transport, op, real_rank(vrank - mask), data, bytes);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vrank + mask < n) send_bytes(transport, op, real_rank(vrank + mask), data, bytes);
  }
}

void broadcast_chain(Transport& transport, const OpContext& op, void* data, std::size_t bytes, int root) {
  const int n = transport.size();
  const int r = transport.rank();
  const int next = (r + 1) % n;
  const int prev = (r - 1 + n) % n;
  const bool is_last = next == root;
  auto* buf = static_cast<std::byte*>(data);
  if (r == root) {
    send_bytes(transport, op, next, buf, bytes);
    return;
  }
  BufferSink sink(buf, bytes);
  ForwardSource forward(sink, buf, bytes);
  const Channel channels[] = {{prev, nullptr, &sink}, {next, &forward, nullptr}};
  transport.transfer(op, std::span(channels, is_last ? 1 : 2));
}

// The collective: every rank checks the root first, then the tree or the
// chain by size.
void TransportCollectives::broadcast(const OpContext& op, Buffer data, int root) {
  if (transport_.size() == 1 || data.count == 0) return;
  check_root_agreement(transport_, op);
  if (data.bytes() <= small_bytes_)
    broadcast_tree(transport_, op, data.data, data.bytes(), root);
  else
    broadcast_chain(transport_, op, data.data, data.bytes(), root);
}

}  // namespace lockstep
