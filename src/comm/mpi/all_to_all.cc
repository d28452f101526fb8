// mpi all_to_all and allgather with per-rank counts: MPI_Ialltoall for
// equal blocks (one ByteRange each); MPI_Ialltoallv and MPI_Iallgatherv
// otherwise, counted in elements of a contiguous type of the element's
// size. MPI's counts and displacements are int: larger ones are refused
// with InvalidArgument. The count arrays live in the backend's scratch
// memory, which MPI may still read after a timeout (see mpi_backend.h).
#include <algorithm>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "comm/mpi/mpi_backend.h"
#include "lockstep/error.h"

namespace lockstep::mpi {
namespace {

// An MPI datatype of `bytes` contiguous bytes, freed with the object.
class ElementType {
 public:
  explicit ElementType(std::size_t bytes) {
    MPI_Type_contiguous(static_cast<int>(bytes), MPI_BYTE, &type_);
    MPI_Type_commit(&type_);
  }
  ~ElementType() { MPI_Type_free(&type_); }
  ElementType(const ElementType&) = delete;
  ElementType& operator=(const ElementType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

int as_mpi_int(std::size_t v, const OpContext& op, const std::string& self) {
  if (v > static_cast<std::size_t>(INT_MAX))
    throw InvalidArgument(fmt::format("{}: {}: {} elements is more than MPI's int counts and displacements take; "
                                      "split the operation or use the shm or tcp backend",
                                      self, op.description(), v));
  return static_cast<int>(v);
}

}  // namespace

void MpiBackend::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  check_agreement(op);
  const std::size_t elem = dtype_size(input.dtype);
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  if (size_ == 1) {
    if (counts.send_count(0) > 0) std::memcpy(out, in, counts.send_count(0) * elem);
    return;
  }
  if (counts.max_block() == 0) return;
  MPI_Request request = MPI_REQUEST_NULL;
  if (op.info.counts_digest == 0) {  // equal blocks
    const ByteRange block(counts.max_block() * elem, max_count_);
    check(MPI_Ialltoall(in, block.count(), block.type(), out, block.count(), block.type(), comm_, &request), op,
          "MPI_Ialltoall");
    return wait(request, op, "MPI_Ialltoall", input.bytes());
  }
  const auto n = static_cast<std::size_t>(size_);
  int* arrays = reinterpret_cast<int*>(layouts_.get(4 * n * sizeof(int)));
  int* send_counts = arrays;
  int* send_displs = arrays + n;
  int* recv_counts = arrays + 2 * n;
  int* recv_displs = arrays + 3 * n;
  for (int q = 0; q < size_; ++q) {
    const auto uq = static_cast<std::size_t>(q);
    send_counts[uq] = as_mpi_int(counts.send_count(q), op, self_);
    send_displs[uq] = as_mpi_int(counts.send_offset(q), op, self_);
    recv_counts[uq] = as_mpi_int(counts.recv_count(q), op, self_);
    recv_displs[uq] = as_mpi_int(counts.recv_offset(q), op, self_);
  }
  const ElementType type(elem);
  check(MPI_Ialltoallv(in, send_counts, send_displs, type.get(), out, recv_counts, recv_displs, type.get(), comm_,
                       &request),
        op, "MPI_Ialltoallv");
  wait(request, op, "MPI_Ialltoallv", std::max(input.bytes(), output.bytes()));
}

void MpiBackend::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                             const std::vector<std::size_t>& counts) {
  check_agreement(op);
  const std::size_t elem = dtype_size(input.dtype);
  const auto n = static_cast<std::size_t>(size_);
  auto* out = static_cast<std::byte*>(output.data);
  std::size_t own_offset = 0;
  for (int q = 0; q < rank_; ++q) own_offset += counts[static_cast<std::size_t>(q)];
  if (input.bytes() > 0) std::memmove(out + own_offset * elem, input.data, input.bytes());
  if (size_ == 1 || *std::max_element(counts.begin(), counts.end()) == 0) return;
  int* arrays = reinterpret_cast<int*>(layouts_.get(2 * n * sizeof(int)));
  std::size_t offset = 0;
  for (std::size_t q = 0; q < n; ++q) {
    arrays[q] = as_mpi_int(counts[q], op, self_);
    arrays[n + q] = as_mpi_int(offset, op, self_);
    offset += counts[q];
  }
  const ElementType type(elem);
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, arrays, arrays + n, type.get(), comm_, &request), op,
        "MPI_Iallgatherv");
  wait(request, op, "MPI_Iallgatherv", output.bytes());
}

}  // namespace lockstep::mpi
