// tcp point to point: the sender writes a header (tag, dtype, byte count)
// before the payload; the receiver checks it against what it expects, so a
// mismatched pair fails with both descriptions instead of corrupting data.
#include <fmt/format.h>

#include "common/format.h"
#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr std::uint32_t kP2pMagic = 0x4c4b5032;  // "LKP2"

struct P2pHeader {
  std::uint32_t magic;
  std::int32_t tag;
  std::uint64_t bytes;
  std::uint8_t dtype;
  std::uint8_t reserved[7];
};

}  // namespace

void TcpBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  const P2pHeader header{kP2pMagic, tag, data.bytes(), static_cast<std::uint8_t>(data.dtype), {}};
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
  const auto sent_dtype = static_cast<DType>(header.dtype);
  if (header.tag != tag || header.bytes != data.bytes() || sent_dtype != data.dtype)
    throw MismatchError(fmt::format("{}: {} from rank {} expected tag {}, {} x {} ({} bytes), but rank {} sent tag {}, "
                                    "{} bytes of {}; make the send and the recv agree",
                                    mesh_.self(), op.description(), src, tag, data.count, data.dtype, data.bytes(), src,
                                    header.tag, header.bytes, sent_dtype));
  recv_bytes(mesh_, op, src, data.data, data.bytes());
}

}  // namespace lockstep
