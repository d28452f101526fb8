// mpi allreduce: MPI_Iallreduce in place, on the caller's buffer (or its
// fp32 copy for 16-bit types), in pieces of at most max_count elements.
#include "comm/mpi/mpi_backend.h"

namespace lockstep::mpi {

void MpiBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  check_agreement(op);
  if (size_ == 1 || data.count == 0) return;
  const Accumulator acc = accumulate(data.data, data.count, data.dtype, reduce_op, accumulation_);
  const std::size_t elem = dtype_size(acc.dtype());
  for_each_piece(data.count, max_count_, [&](std::size_t first, std::size_t n) {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, acc.data() + first * elem, static_cast<int>(n),
                         acc.type, acc.op, comm_, &request),
          op, "MPI_Iallreduce");
    wait(request, op, "MPI_Iallreduce", n * elem);
  });
  acc.values.finish(0, data.count, reduce_op, size_, data.data);
}

}  // namespace lockstep::mpi
