// mpi allgather: place this rank's input in its slot of the output, then
// MPI_Iallgather in place (which also makes an input that aliases its slot
// legal; MPI forbids overlapping send and receive buffers otherwise).
#include <cstring>

#include "comm/mpi/mpi_backend.h"

namespace lockstep::mpi {

void MpiBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  check_agreement(op);
  const std::size_t bytes = input.bytes();
  auto* slot = static_cast<std::byte*>(output.data) + static_cast<std::size_t>(rank_) * bytes;
  if (bytes > 0 && slot != input.data) std::memmove(slot, input.data, bytes);
  if (size_ == 1 || bytes == 0) return;
  const ByteRange block(bytes, max_count_);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, output.data, block.count(), block.type(), comm_, &request),
        op, "MPI_Iallgather");
  wait(request, op, "MPI_Iallgather", bytes * static_cast<std::size_t>(size_));
}

}  // namespace lockstep::mpi
