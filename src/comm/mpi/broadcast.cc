// mpi broadcast: MPI_Ibcast of the buffer's bytes (no arithmetic, so the
// dtype does not matter to MPI).
#include "comm/mpi/mpi_backend.h"

namespace lockstep::mpi {

void MpiBackend::broadcast(const OpContext& op, Buffer data, int root) {
  check_agreement(op);
  if (size_ == 1 || data.bytes() == 0) return;
  const ByteRange range(data.bytes(), max_count_);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibcast(data.data, range.count(), range.type(), root, comm_, &request), op, "MPI_Ibcast");
  wait(request, op, "MPI_Ibcast", data.bytes());
}

}  // namespace lockstep::mpi
