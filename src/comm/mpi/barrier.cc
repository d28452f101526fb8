// mpi barrier: MPI_Ibarrier.
#include "comm/mpi/mpi_backend.h"

namespace lockstep::mpi {

void MpiBackend::barrier(const OpContext& op) {
  check_agreement(op);
  if (size_ == 1) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm_, &request), op, "MPI_Ibarrier");
  wait(request, op, "MPI_Ibarrier", 0);
}

}  // namespace lockstep::mpi
