// shm broadcast: inline for tiny buffers; otherwise in rounds of one slot:
// the root copies a piece into its slot, everyone else copies it out; or,
// from 32 KiB where every rank can read its peers' memory and that
// measures cheaper (ordinary_paths.h), in one copy: each rank reads the
// root's buffer straight into its own (single_copy.h).
// The root also waits for every peer's arrival at the broadcast (the first
// round's) and checks its stamp: ranks that each name themselves the root
// would otherwise all hand out their data, read nobody's, and go on with
// different buffers.
#include <algorithm>
#include <cstring>

#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::broadcast(const OpContext& op, Buffer data, int root) {
  if (size_ == 1 || data.count == 0) return;
  if (data.bytes() <= kInlineBytes) {
    const std::uint64_t seq = post_inline(data.data, rank_ == root ? data.bytes() : 0, op);
    if (rank_ != root) {
      wait_inline(root, seq, op, "the root's data of a small broadcast");
      std::memcpy(data.data, inline_payload(root, seq), data.bytes());
    } else {
      for (int q = 0; q < size_; ++q)
        if (q != rank_) wait_inline(q, seq, op, "its arrival at the broadcast");
    }
    return;
  }
  if (single_copy(data.bytes()) && ordinary_path_ != ShmOrdinaryPath::slots) {
    run_ordinary(op, broadcast_paths_, data.bytes(), [&](OrdinaryPaths::Path path) {
      if (path == OrdinaryPaths::Path::single_copy) return broadcast_single_copy(op, data, root);
      broadcast_through_slots(op, data, root);
    });
    return;
  }
  broadcast_through_slots(op, data, root);
}

void ShmBackend::broadcast_through_slots(const OpContext& op, Buffer data, int root) {
  auto* buf = static_cast<std::byte*>(data.data);
  for (std::size_t begin = 0; begin < data.bytes(); begin += layout_.slot_bytes) {
    const std::size_t bytes = std::min(layout_.slot_bytes, data.bytes() - begin);
    const std::uint64_t g = begin_round(op);
    if (rank_ == root) to_slot(slot(rank_, g), buf + begin, bytes);
    post_arrive(g, op);
    if (rank_ != root) {
      wait_arrived(root, g, op, "the broadcast data");
      std::memcpy(buf + begin, slot(root, g), bytes);
    } else if (begin == 0) {
      wait_arrived_all(g, op, "its arrival at the broadcast");
    }
    control(rank_).consumed.post(g + 1);
  }
}

// One round: the root posts its buffer's address (stamped as the
// broadcast, so a peer in another collective fails the check before it
// reads), the others read the whole buffer from it, and the root returns
// once every peer says it has finished reading.
void ShmBackend::broadcast_single_copy(const OpContext& op, Buffer data, int root) {
  const std::uint64_t g = begin_round(op);
  const auto address = reinterpret_cast<std::uint64_t>(data.data);
  std::memcpy(slot(rank_, g), &address, sizeof address);
  post_arrive(g, op);
  if (rank_ == root) {
    wait_arrived_all(g, op, "its arrival at the broadcast");
  } else {
    wait_arrived(root, g, op, "the broadcast data");
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, slot(root, g), sizeof theirs);
    read_peer_or_throw(op, root, data.data, reinterpret_cast<const void*>(theirs), data.bytes());
  }
  control(rank_).consumed.post(g + 1);
  if (rank_ == root) wait_all(&ControlBlock::consumed, g + 1, op, "to finish reading the root's buffer");
}

}  // namespace lockstep::shm
