// shm allgather: in rounds, each rank puts the next piece of its input in
// its slot, then copies every peer's piece into place in its output. Large
// inputs, where every rank can read its peers' memory, go in one copy:
// each rank reads every peer's input straight into its output
// (single_copy.h), a third less copying than through the slots.
#include <algorithm>
#include <cstring>

#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  const std::size_t bytes = input.bytes();
  auto* out = static_cast<std::byte*>(output.data);
  const auto* in = static_cast<const std::byte*>(input.data);
  std::byte* own_place = out + static_cast<std::size_t>(rank_) * bytes;
  if (bytes > 0 && own_place != in) std::memmove(own_place, in, bytes);
  if (size_ == 1 || bytes == 0) return;
  if (single_copy(bytes)) {
    single_copy_round(op, in, /*read_everyone=*/true, -1, [&](int q, const std::byte* theirs) {
      read_peer_or_throw(op, q, out + static_cast<std::size_t>(q) * bytes, theirs, bytes);
    });
    return;
  }
  for (std::size_t begin = 0; begin < bytes; begin += layout_.slot_bytes) {
    const std::size_t piece = std::min(layout_.slot_bytes, bytes - begin);
    const std::uint64_t g = begin_round(op);
    to_slot(slot(rank_, g), in + begin, piece);
    post_arrive(g, op);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      wait_arrived(q, g, op, "its input");
      std::memcpy(out + static_cast<std::size_t>(q) * bytes + begin, slot(q, g), piece);
    }
    control(rank_).consumed.post(g + 1);
  }
}

}  // namespace lockstep::shm
