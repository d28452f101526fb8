// shm reduce_scatter: in rounds, each rank puts the next piece of every
// block others own into its slot, then reduces its own block's piece from
// everyone (rank order, one fused pass) straight into its output.
#include <algorithm>
#include <cstring>

#include "comm/reduce_kernels.h"
#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  const std::size_t elem = dtype_size(input.dtype);
  const std::size_t block = output.count;  // elements per rank
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  if (block == 0) return;
  if (size_ == 1) {
    std::memmove(out, in, output.bytes());
    return;
  }
  const std::size_t piece_elems = std::max<std::size_t>(1, layout_.slot_bytes / static_cast<std::size_t>(size_) / elem);
  const std::size_t area = piece_elems * elem;  // bytes per block in a slot
  for (std::size_t begin = 0; begin < block; begin += piece_elems) {
    const std::size_t count = std::min(piece_elems, block - begin);
    const auto in_block = [&](int b) { return in + (static_cast<std::size_t>(b) * block + begin) * elem; };
    const std::uint64_t g = begin_round(op);
    for (int b = 0; b < size_; ++b)
      if (b != rank_) to_slot(slot(rank_, g) + static_cast<std::size_t>(b) * area, in_block(b), count * elem);
    post_arrive(g, op);
    wait_arrived_all(g, op, "its input");
    for (int q = 0; q < size_; ++q)
      sources_[static_cast<std::size_t>(q)] =
          q == rank_ ? static_cast<const void*>(in_block(rank_)) : slot(q, g) + static_cast<std::size_t>(rank_) * area;
    reduce_many(out + begin * elem, sources_.data(), size_, count, input.dtype, reduce_op);
    control(rank_).consumed.post(g + 1);
  }
}

}  // namespace lockstep::shm
