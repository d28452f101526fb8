// mpi gather and scatter: MPI_Igather / MPI_Iscatter with each rank's block
// as one ByteRange. The root's own block is moved first and then passed as
// MPI_IN_PLACE (MPI forbids overlapping send and receive buffers).
#include <cstring>

#include "comm/mpi/mpi_backend.h"

namespace lockstep::mpi {

void MpiBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  check_agreement(op);
  const std::size_t bytes = input.bytes();
  const bool is_root = rank_ == root;
  auto* out = static_cast<std::byte*>(output.data);
  if (is_root && bytes > 0) std::memmove(out + static_cast<std::size_t>(root) * bytes, input.data, bytes);
  if (size_ == 1 || bytes == 0) return;
  const ByteRange block(bytes, max_count_);
  MPI_Request request = MPI_REQUEST_NULL;
  if (is_root)
    check(MPI_Igather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, block.count(), block.type(), root, comm_, &request), op,
          "MPI_Igather");
  else
    check(MPI_Igather(input.data, block.count(), block.type(), nullptr, 0, MPI_DATATYPE_NULL, root, comm_, &request),
          op, "MPI_Igather");
  wait(request, op, "MPI_Igather", bytes * (is_root ? static_cast<std::size_t>(size_) : 1));
}

void MpiBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  check_agreement(op);
  const std::size_t bytes = output.bytes();
  const bool is_root = rank_ == root;
  const auto* in = static_cast<const std::byte*>(input.data);
  if (is_root && bytes > 0) std::memmove(output.data, in + static_cast<std::size_t>(root) * bytes, bytes);
  if (size_ == 1 || bytes == 0) return;
  const ByteRange block(bytes, max_count_);
  MPI_Request request = MPI_REQUEST_NULL;
  if (is_root)
    check(MPI_Iscatter(in, block.count(), block.type(), MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, root, comm_, &request), op,
          "MPI_Iscatter");
  else
    check(MPI_Iscatter(nullptr, 0, MPI_DATATYPE_NULL, output.data, block.count(), block.type(), root, comm_, &request),
          op, "MPI_Iscatter");
  wait(request, op, "MPI_Iscatter", bytes * (is_root ? static_cast<std::size_t>(size_) : 1));
}

}  // namespace lockstep::mpi
