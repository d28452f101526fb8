// mpi reduce: MPI_Ireduce towards the root, in place there. Other ranks only
// hand their buffer (or its fp32 copy) to MPI to read, so it is left
// unchanged, as the interface promises.
#include "comm/mpi/mpi_backend.h"

namespace lockstep::mpi {

void MpiBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  check_agreement(op);
  if (size_ == 1 || data.count == 0) return;
  const Accumulator acc = accumulate(data.data, data.count, data.dtype, reduce_op, accumulation_);
  const std::size_t elem = dtype_size(acc.dtype());
  for_each_piece(data.count, max_count_, [&](std::size_t first, std::size_t n) {
    std::byte* piece = acc.data() + first * elem;
    MPI_Request request = MPI_REQUEST_NULL;
    if (rank_ == root)
      check(MPI_Ireduce(MPI_IN_PLACE, piece, static_cast<int>(n), acc.type, acc.op, root, comm_, &request), op,
            "MPI_Ireduce");
    else
      check(MPI_Ireduce(piece, nullptr, static_cast<int>(n), acc.type, acc.op, root, comm_, &request), op,
            "MPI_Ireduce");
    wait(request, op, "MPI_Ireduce", n * elem);
  });
  if (rank_ == root) acc.values.finish(0, data.count, reduce_op, size_, data.data);
}

}  // namespace lockstep::mpi
