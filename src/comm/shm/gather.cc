// shm gather: inline for tiny inputs; otherwise in rounds of one slot:
// every other rank copies the next piece of its input into its slot, and
// the root copies each piece into place in its output. Large inputs, where
// every rank can read its peers' memory, go in one copy: the root reads
// each input straight into its output (single_copy.h). Every other rank
// checks the root's stamp, as in reduce.cc.
#include <algorithm>
#include <cstring>

#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  const std::size_t bytes = input.bytes();
  auto* out = static_cast<std::byte*>(output.data);
  const auto* in = static_cast<const std::byte*>(input.data);
  const bool is_root = rank_ == root;
  if (is_root && bytes > 0) std::memmove(out + static_cast<std::size_t>(root) * bytes, in, bytes);
  if (size_ == 1 || bytes == 0) return;
  if (bytes <= kInlineBytes) {
    const std::uint64_t seq = post_inline(in, is_root ? 0 : bytes, op);
    if (!is_root) {
      wait_inline(root, seq, op, "the root's arrival at a small gather");
      return;
    }
    for (int q = 0; q < size_; ++q) {
      if (q == root) continue;
      wait_inline(q, seq, op, "its input to a small gather");
      std::memcpy(out + static_cast<std::size_t>(q) * bytes, inline_payload(q, seq), bytes);
    }
    return;
  }
  if (single_copy(bytes)) {
    // Other ranks "read" the root: nothing, but its address's stamp is checked.
    single_copy_round(op, in, /*read_everyone=*/is_root, root, [&](int q, const std::byte* theirs) {
      if (is_root) read_peer_or_throw(op, q, out + static_cast<std::size_t>(q) * bytes, theirs, bytes);
    });
    return;
  }
  for (std::size_t begin = 0; begin < bytes; begin += layout_.slot_bytes) {
    const std::size_t piece = std::min(layout_.slot_bytes, bytes - begin);
    const std::uint64_t g = begin_round(op);
    if (!is_root) to_slot(slot(rank_, g), in + begin, piece);
    post_arrive(g, op);
    if (is_root) {
      for (int q = 0; q < size_; ++q) {
        if (q == root) continue;
        wait_arrived(q, g, op, "its input");
        std::memcpy(out + static_cast<std::size_t>(q) * bytes + begin, slot(q, g), piece);
      }
    } else if (begin == 0) {
      wait_arrived(root, g, op, "the root's arrival at the gather");
    }
    control(rank_).consumed.post(g + 1);
  }
}

}  // namespace lockstep::shm
