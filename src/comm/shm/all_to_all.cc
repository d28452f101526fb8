// shm all_to_all: each rank's slot holds one area per peer. In rounds,
// every rank copies the next piece of its block for rank q into area q of
// its slot, then copies area `rank` of every peer's slot into its output.
// Rounds run until the largest block of any pair is through (BlockCounts
// knows it on every rank), so all ranks agree on their number. Tiny
// exchanges travel inline, every block in one line; large ones, where
// every rank can read its peers' memory, in one copy: each rank reads its
// block straight from each peer's input (single_copy.h).
#include <algorithm>
#include <cstring>

#include "comm/shm/shm_backend.h"

namespace lockstep::shm {
namespace {

// Bytes of a block of `total` bytes that fall in [begin, begin + area).
std::size_t piece_of(std::size_t total, std::size_t begin, std::size_t area) {
  return total > begin ? std::min(area, total - begin) : 0;
}

}  // namespace

void ShmBackend::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  const std::size_t elem = dtype_size(input.dtype);
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  const auto send_at = [&](int q) { return in + counts.send_offset(q) * elem; };
  const auto recv_at = [&](int q) { return out + counts.recv_offset(q) * elem; };
  if (counts.send_count(rank_) > 0) std::memcpy(recv_at(rank_), send_at(rank_), counts.send_count(rank_) * elem);
  const std::size_t max_bytes = counts.max_block() * elem;
  if (size_ == 1 || max_bytes == 0) return;
  const auto n = static_cast<std::size_t>(size_);
  if (max_bytes * n <= kInlineBytes) {
    unsigned char packed[kInlineBytes] = {};
    for (int q = 0; q < size_; ++q)
      if (q != rank_) std::memcpy(packed + static_cast<std::size_t>(q) * max_bytes, send_at(q), counts.send_count(q) * elem);
    const std::uint64_t seq = post_inline(packed, max_bytes * n, op);
    for (int i = 1; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      wait_inline(q, seq, op, "its blocks of a small all_to_all");
      std::memcpy(recv_at(q), inline_payload(q, seq) + static_cast<std::size_t>(rank_) * max_bytes,
                  counts.recv_count(q) * elem);
    }
    return;
  }
  if (single_copy(max_bytes)) {
    single_copy_round(op, in, /*read_everyone=*/true, -1, [&](int q, const std::byte* theirs) {
      const std::size_t bytes = counts.recv_count(q) * elem;
      if (bytes > 0) read_peer_or_throw(op, q, recv_at(q), theirs + counts.offset(q, rank_) * elem, bytes);
    });
    return;
  }
  const std::size_t area = std::max<std::size_t>(64, layout_.slot_bytes / n / 64 * 64);
  for (std::size_t begin = 0; begin < max_bytes; begin += area) {
    const std::uint64_t g = begin_round(op);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const std::size_t piece = piece_of(counts.send_count(q) * elem, begin, area);
      if (piece > 0) to_slot(slot(rank_, g) + static_cast<std::size_t>(q) * area, send_at(q) + begin, piece);
    }
    post_arrive(g, op);
    // Start with the next rank up, so ranks do not all read rank 0 first.
    for (int i = 1; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      wait_arrived(q, g, op, "its blocks");
      const std::size_t piece = piece_of(counts.recv_count(q) * elem, begin, area);
      if (piece > 0) std::memcpy(recv_at(q) + begin, slot(q, g) + static_cast<std::size_t>(rank_) * area, piece);
    }
    control(rank_).consumed.post(g + 1);
  }
}

void ShmBackend::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                             const std::vector<std::size_t>& counts) {
  const std::size_t elem = dtype_size(input.dtype);
  auto* out = static_cast<std::byte*>(output.data);
  const auto* in = static_cast<const std::byte*>(input.data);
  std::vector<std::size_t> offsets(counts.size() + 1, 0);
  for (std::size_t q = 0; q < counts.size(); ++q) offsets[q + 1] = offsets[q] + counts[q];
  const auto mine = static_cast<std::size_t>(rank_);
  if (input.bytes() > 0) std::memmove(out + offsets[mine] * elem, in, input.bytes());
  const std::size_t max_bytes = *std::max_element(counts.begin(), counts.end()) * elem;
  if (size_ == 1 || max_bytes == 0) return;
  if (single_copy(max_bytes)) {
    single_copy_round(op, in, /*read_everyone=*/true, -1, [&](int q, const std::byte* theirs) {
      const std::size_t bytes = counts[static_cast<std::size_t>(q)] * elem;
      if (bytes > 0) read_peer_or_throw(op, q, out + offsets[static_cast<std::size_t>(q)] * elem, theirs, bytes);
    });
    return;
  }
  for (std::size_t begin = 0; begin < max_bytes; begin += layout_.slot_bytes) {
    const std::uint64_t g = begin_round(op);
    const std::size_t own = piece_of(input.bytes(), begin, layout_.slot_bytes);
    if (own > 0) to_slot(slot(rank_, g), in + begin, own);
    post_arrive(g, op);
    for (int i = 1; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      wait_arrived(q, g, op, "its input");
      const std::size_t piece = piece_of(counts[static_cast<std::size_t>(q)] * elem, begin, layout_.slot_bytes);
      if (piece > 0) std::memcpy(out + offsets[static_cast<std::size_t>(q)] * elem + begin, slot(q, g), piece);
    }
    control(rank_).consumed.post(g + 1);
  }
}

}  // namespace lockstep::shm
