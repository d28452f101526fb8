// shm scatter: inline when every block fits one line together; otherwise
// in rounds: the root puts the next piece of every other rank's block in
// its own area of the root's slot, and each rank copies its piece out.
// Large blocks, where every rank can read its peers' memory, go in one
// copy: each rank reads its block straight from the root's input. The
// root checks every peer's stamp, as in broadcast.cc.
#include <algorithm>
#include <cstring>

#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  const std::size_t bytes = output.bytes();  // per rank
  auto* out = static_cast<std::byte*>(output.data);
  const auto* in = static_cast<const std::byte*>(input.data);
  const bool is_root = rank_ == root;
  const auto block = [&](int q) { return in + static_cast<std::size_t>(q) * bytes; };
  if (is_root && bytes > 0) std::memmove(out, block(root), bytes);
  if (size_ == 1 || bytes == 0) return;
  if (bytes * static_cast<std::size_t>(size_) <= kInlineBytes) {
    const std::uint64_t seq = post_inline(in, is_root ? bytes * static_cast<std::size_t>(size_) : 0, op);
    if (is_root) {
      for (int q = 0; q < size_; ++q)
        if (q != rank_) wait_inline(q, seq, op, "its arrival at a small scatter");
      return;
    }
    wait_inline(root, seq, op, "the root's data of a small scatter");
    std::memcpy(out, inline_payload(root, seq) + static_cast<std::size_t>(rank_) * bytes, bytes);
    return;
  }
  if (single_copy(bytes)) {
    // The root "reads" everyone: nothing, but their stamps are checked.
    single_copy_round(op, in, /*read_everyone=*/is_root, root, [&](int q, const std::byte* theirs) {
      if (!is_root) read_peer_or_throw(op, q, out, theirs + static_cast<std::size_t>(rank_) * bytes, bytes);
    });
    return;
  }
  const std::size_t area = std::max<std::size_t>(64, layout_.slot_bytes / static_cast<std::size_t>(size_) / 64 * 64);
  for (std::size_t begin = 0; begin < bytes; begin += area) {
    const std::size_t piece = std::min(area, bytes - begin);
    const std::uint64_t g = begin_round(op);
    if (is_root) {
      for (int q = 0; q < size_; ++q)
        if (q != root) to_slot(slot(rank_, g) + static_cast<std::size_t>(q) * area, block(q) + begin, piece);
    }
    post_arrive(g, op);
    if (!is_root) {
      wait_arrived(root, g, op, "the root's data");
      std::memcpy(out + begin, slot(root, g) + static_cast<std::size_t>(rank_) * area, piece);
    } else if (begin == 0) {
      wait_arrived_all(g, op, "its arrival at the scatter");
    }
    control(rank_).consumed.post(g + 1);
  }
}

}  // namespace lockstep::shm
