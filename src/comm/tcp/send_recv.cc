// tcp point to point: the sender writes a header (tag, dtype, byte count)
// before the payload; the receiver checks it against what it expects, so a
// mismatched pair fails with both descriptions instead of corrupting data.
// A recv from any source finds the sender (first_sender.h), then receives
// from it as from a named source.
#include <fmt/format.h>

#include "comm/p2p_header.h"
#include "comm/tcp/first_sender.h"
#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"
#include "lockstep/error.h"

namespace lockstep {

void TcpBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  const P2pHeader header = p2p_header(data, tag);
  send_bytes(mesh_, op, dst, &header, sizeof header);
  send_bytes(mesh_, op, dst, data.data, data.bytes());
}

void TcpBackend::recv(const OpContext& op, Buffer data, int src, int tag) {
  P2pHeader header{};
  recv_bytes(mesh_, op, src, &header, sizeof header);
  if (header.magic != kP2pMagic)
    throw MismatchError(fmt::format("{}: {} from rank {}: rank {} was not sending (it is in a different collective); "
                                    "the ranks issued different sequences of operations",
                                    mesh_.self(), op.description(), src, src));
  if (!p2p_matches(header, data, tag)) throw_p2p_mismatch(header, mesh_.self(), op, src, data, tag);
  recv_bytes(mesh_, op, src, data.data, data.bytes());
}

int TcpBackend::recv_any(const OpContext& op, Buffer data, int tag) {
  const int source = first_sender(mesh_, op, last_any_source_);
  last_any_source_ = source;
  recv(op, data, source, tag);
  return source;
}

}  // namespace lockstep
