// mpi point to point: the sender sends a header (tag, dtype, byte count),
// then the payload, as two messages on the group's communicator with MPI
// tags of their own (lockstep's tag travels in the header, so any int is a
// valid tag). MPI delivers messages of one sender and tag in order, so
// headers and payloads pair up. The receiver checks the header against what
// it expects; on a mismatch it still takes the payload (into scratch
// memory), so the sender completes, and then throws MismatchError naming
// both sides. A recv from any source posts its header's receive with
// MPI_ANY_SOURCE and reads the sender from the status.
#include <fmt/format.h>

#include "comm/mpi/mpi_backend.h"
#include "comm/p2p_header.h"
#include "lockstep/error.h"

namespace lockstep::mpi {
namespace {

constexpr int kHeaderTag = 1;
constexpr int kPayloadTag = 2;

}  // namespace

void MpiBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  // The header lives in scratch memory, not on the stack: after a timeout
  // MPI may still use it (see mpi_backend.h).
  auto* header = reinterpret_cast<P2pHeader*>(header_.get(sizeof(P2pHeader)));
  *header = p2p_header(data, tag);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Isend(header, sizeof *header, MPI_BYTE, dst, kHeaderTag, comm_, &request), op, "MPI_Isend");
  wait(request, op, "MPI_Isend", sizeof *header, dst);
  if (data.bytes() == 0) return;
  const ByteRange range(data.bytes(), max_count_);
  check(MPI_Isend(data.data, range.count(), range.type(), dst, kPayloadTag, comm_, &request), op, "MPI_Isend");
  wait(request, op, "MPI_Isend", data.bytes(), dst);
}

void MpiBackend::recv(const OpContext& op, Buffer data, int src, int tag) { receive(op, data, src, tag); }

int MpiBackend::recv_any(const OpContext& op, Buffer data, int tag) { return receive(op, data, MPI_ANY_SOURCE, tag); }

// The header from `from` (a rank, or MPI_ANY_SOURCE: the first header any
// rank sent), then the payload from the rank that sent that header, which
// MPI delivers after it (messages of one sender and tag do not overtake).
int MpiBackend::receive(const OpContext& op, Buffer data, int from, int tag) {
  auto* received = reinterpret_cast<P2pHeader*>(header_.get(sizeof(P2pHeader)));
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Status status{};
  check(MPI_Irecv(received, sizeof *received, MPI_BYTE, from, kHeaderTag, comm_, &request), op, "MPI_Irecv");
  wait(request, op, "MPI_Irecv", sizeof *received, from == MPI_ANY_SOURCE ? -1 : from, &status);
  const int src = status.MPI_SOURCE;
  const P2pHeader header = *received;
  if (header.magic != kP2pMagic)
    throw MismatchError(fmt::format("{}: {} from rank {}: what rank {} sent is not a lockstep message; is another "
                                    "library using this group's communicator?",
                                    self_, op.description(), src, src));
  const bool match = p2p_matches(header, data, tag);
  void* target = match ? data.data : staging_.get(header.bytes);
  if (header.bytes > 0) {
    const ByteRange range(header.bytes, max_count_);
    check(MPI_Irecv(target, range.count(), range.type(), src, kPayloadTag, comm_, &request), op, "MPI_Irecv");
    wait(request, op, "MPI_Irecv", header.bytes, src);
  }
  if (!match) throw_p2p_mismatch(header, self_, op, src, data, tag);
  return src;
}

}  // namespace lockstep::mpi
