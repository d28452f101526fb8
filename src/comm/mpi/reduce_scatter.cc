// mpi reduce_scatter: MPI_Ireduce_scatter_block from the input (or its fp32
// copy) into the output (or an fp32 staging block, rounded once after).
// Blocks longer than one MPI call can carry are reduced piece by piece with
// MPI_Ireduce, each rooted at the rank that owns the block.
#include <cstring>

#include "comm/mpi/mpi_backend.h"
#include "comm/reduce_kernels.h"

namespace lockstep::mpi {
namespace {

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto* pa = static_cast<const std::byte*>(a);
  const auto* pb = static_cast<const std::byte*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

void MpiBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  check_agreement(op);
  const std::size_t count = output.count;
  const std::size_t total = count * static_cast<std::size_t>(size_);
  if (count == 0) return;
  if (size_ == 1) {
    if (output.data != input.data) std::memmove(output.data, input.data, output.bytes());
    return;
  }
  // MPI forbids a send buffer that overlaps the receive buffer: work on a
  // copy then (a 16-bit input is copied anyway, when it is widened).
  const void* in = input.data;
  if (accumulation_dtype(input.dtype) == input.dtype && overlap(input.data, input.bytes(), output.data, output.bytes())) {
    std::byte* copy = accumulation_.get(input.bytes());
    std::memcpy(copy, input.data, input.bytes());
    in = copy;
  }
  const Accumulator acc = accumulate(in, total, input.dtype, reduce_op, accumulation_);
  const std::size_t elem = dtype_size(acc.dtype());
  void* out = acc.values.widened() ? staging_.get(count * elem) : output.data;

  if (count <= max_count_) {
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ireduce_scatter_block(acc.data(), out, static_cast<int>(count), acc.type, acc.op, comm_, &request), op,
          "MPI_Ireduce_scatter_block");
    wait(request, op, "MPI_Ireduce_scatter_block", total * elem);
  } else {
    for (int block = 0; block < size_; ++block) {
      const std::byte* source = acc.data() + static_cast<std::size_t>(block) * count * elem;
      for_each_piece(count, max_count_, [&](std::size_t first, std::size_t n) {
        void* target = block == rank_ ? static_cast<std::byte*>(out) + first * elem : nullptr;
        MPI_Request request = MPI_REQUEST_NULL;
        check(MPI_Ireduce(source + first * elem, target, static_cast<int>(n), acc.type, acc.op, block, comm_,
                          &request),
              op, "MPI_Ireduce");
        wait(request, op, "MPI_Ireduce", n * elem);
      });
    }
  }
  // The result to finish is this rank's block, where MPI left it.
  Accumulation::of_accumulated(out, acc.dtype(), input.dtype).finish(0, count, reduce_op, size_, output.data);
}

}  // namespace lockstep::mpi
