// Memory layout of one rank's shared region in the shm backend. Every rank
// has one region with the same layout; it writes its own and reads its
// peers'. Counters and inline lines sit on their own cache lines so that a
// writer never invalidates a line another rank is polling for a different
// reason.
//
//   control block     magic, owner, round counters, two inline lines,
//                     the doorbell of messages to this rank
//   p2p counters      sent-to[q] and received-from[q], one line each
//   p2p mailboxes     to each peer: two slots of kMailboxBytes
//   data slots        kSlots slots of slot_bytes: the pipeline
//
// Plain data; the atomics inside are what ranks synchronise on.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "comm/shm/sync.h"

namespace lockstep::shm {

inline constexpr std::uint64_t kMagic = 0x6c6f636b73746570ull;  // "lockstep"
inline constexpr int kSlots = 4;                    // pipeline depth: rounds a rank may run ahead
inline constexpr std::size_t kInlineBytes = 48;     // payload carried inside the sequence's cache line
inline constexpr std::size_t kMailboxBytes = 64 * 1024;

struct alignas(64) InlineLine {
  std::atomic<std::uint64_t> seq{0};
  mutable std::atomic<std::uint32_t> sleepers{0};
  // What the operation that posted `seq` was (op_stamp.h's inline_stamp):
  // peers compare it with their own before using the payload. Written
  // before `seq`; stable until every peer has posted seq + 1.
  std::atomic<std::uint32_t> stamp{0};
  unsigned char payload[kInlineBytes];
};
static_assert(sizeof(InlineLine) == 64);

struct ControlBlock {
  alignas(64) std::uint64_t magic = 0;
  std::int32_t owner_pid = 0;
  std::int32_t rank = 0;
  // Set (release) when the owner destroys its group, after its last post:
  // a peer still waiting for it then knows it left on purpose, not crashed.
  std::atomic<std::uint32_t> departed{0};
  // This region's address in its owner's address space, for the single-copy
  // probe (single_copy.h): a peer reads the magic number through it.
  std::uint64_t owner_address = 0;
  // Round counters: a rank posts round g + 1 on each when it has
  //   arrive:   put its inputs for round g in its slot,
  //   reduced:  put its reduced chunk for round g in its slot,
  //   consumed: finished reading its peers' slots for round g.
  // Every rank posts arrive and consumed for every round, so "all peers
  // consumed round g" is always a valid test before reusing slot g.
  Counter arrive;
  Counter reduced;
  Counter consumed;
  // Inline operations (payloads up to kInlineBytes, barriers): operation
  // number s uses line s % 2.
  InlineLine lines[2];
  // When this rank last woke a peer sleeping on one of its lines (the
  // lines have no room for it; read only by a peer that slept).
  alignas(64) WakeStamp lines_woke_at{0};
  // Bumped by a peer each time it posts the first chunk of a message to
  // this rank: what a recv from any source sleeps on, since it cannot
  // sleep on every peer's sent-to counter at once. Written by the peers,
  // not by the owner.
  Counter p2p_doorbell;
  // Written by the owner just before it posts arrive, so that a peer can
  // time one load of a line the owner has just written (peer_distance.h).
  // Two lines to itself: the adjacent-line prefetcher fetches pairs.
  struct alignas(128) DistanceProbe {
    std::atomic<std::uint64_t> value{0};
  } distance_probe;
};

// Offsets of each part, the same for every rank of a group.
struct Layout {
  int ranks = 0;
  std::size_t slot_bytes = 0;
  std::size_t p2p_counters = 0;  // offset of Counter[2 * ranks]: sent-to[q], then received-from[q]
  std::size_t mailboxes = 0;     // offset of ranks x 2 x kMailboxBytes
  std::size_t slots = 0;         // offset of kSlots x slot_bytes
  std::size_t total = 0;

  Layout(int n, std::size_t slot) : ranks(n), slot_bytes(slot) {
    const auto align = [](std::size_t v) { return (v + 4095) / 4096 * 4096; };
    p2p_counters = align(sizeof(ControlBlock));
    mailboxes = align(p2p_counters + 2 * static_cast<std::size_t>(n) * sizeof(Counter));
    slots = align(mailboxes + static_cast<std::size_t>(n) * 2 * kMailboxBytes);
    total = align(slots + kSlots * slot_bytes);
  }
};

}  // namespace lockstep::shm
