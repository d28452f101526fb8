// mpi point to point: the sender sends a header (tag, dtype, byte count),
// then the payload, as two messages on the group's communicator with MPI
// tags of their own (lockstep's tag travels in the header, so any int is a
// valid tag). MPI delivers messages of one sender and tag in order, so
// headers and payloads pair up. The receiver checks the header against what
// it expects; on a mismatch it still takes the payload (into scratch
// memory), so the sender completes, and then throws MismatchError naming
// both sides.
#include <fmt/format.h>

#include "comm/mpi/mpi_backend.h"
#include "common/format.h"
#include "lockstep/error.h"

namespace lockstep::mpi {
namespace {

constexpr int kHeaderTag = 1;
constexpr int kPayloadTag = 2;
constexpr std::uint32_t kP2pMagic = 0x4c4b5032;  // "LKP2"

struct P2pHeader {
  std::uint32_t magic;
  std::int32_t tag;
  std::uint64_t bytes;
  std::uint8_t dtype;
  std::uint8_t reserved[7];
};

}  // namespace

void MpiBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  // The header lives in scratch memory, not on the stack: after a timeout
  // MPI may still use it (see mpi_backend.h).
  auto* header = reinterpret_cast<P2pHeader*>(header_.get(sizeof(P2pHeader)));
  *header = P2pHeader{kP2pMagic, tag, data.bytes(), static_cast<std::uint8_t>(data.dtype), {}};
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Isend(header, sizeof *header, MPI_BYTE, dst, kHeaderTag, comm_, &request), op, "MPI_Isend");
  wait(request, op, "MPI_Isend", sizeof *header, dst);
  if (data.bytes() == 0) return;
  const ByteRange range(data.bytes(), max_count_);
  check(MPI_Isend(data.data, range.count(), range.type(), dst, kPayloadTag, comm_, &request), op, "MPI_Isend");
  wait(request, op, "MPI_Isend", data.bytes(), dst);
}

void MpiBackend::recv(const OpContext& op, Buffer data, int src, int tag) {
  auto* received = reinterpret_cast<P2pHeader*>(header_.get(sizeof(P2pHeader)));
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Irecv(received, sizeof *received, MPI_BYTE, src, kHeaderTag, comm_, &request), op, "MPI_Irecv");
  wait(request, op, "MPI_Irecv", sizeof *received, src);
  const P2pHeader header = *received;
  if (header.magic != kP2pMagic)
    throw MismatchError(fmt::format("{}: {} from rank {}: what rank {} sent is not a lockstep message; is another "
                                    "library using this group's communicator?",
                                    self_, op.description(), src, src));
  const auto sent_dtype = static_cast<DType>(header.dtype);
  const bool match = header.tag == tag && header.bytes == data.bytes() && sent_dtype == data.dtype;
  void* target = match ? data.data : staging_.get(header.bytes);
  if (header.bytes > 0) {
    const ByteRange range(header.bytes, max_count_);
    check(MPI_Irecv(target, range.count(), range.type(), src, kPayloadTag, comm_, &request), op, "MPI_Irecv");
    wait(request, op, "MPI_Irecv", header.bytes, src);
  }
  if (!match)
    throw MismatchError(fmt::format("{}: {} from rank {} expected tag {}, {} x {} ({} bytes), but rank {} sent tag {}, "
                                    "{} bytes of {}; make the send and the recv agree",
                                    self_, op.description(), src, tag, data.count, data.dtype, data.bytes(), src,
                                    header.tag, header.bytes, sent_dtype));
}

}  // namespace lockstep::mpi
