// The always-on collective check of the backends that move their own bytes.
// Whatever hands data to a peer carries a stamp of the operation that made
// it: collective, dtype, count, reduction and root. The receiving rank
// compares it with its own operation before it uses the data, so ranks that
// issued different collectives at the same point fail with a MismatchError
// naming both operations instead of reducing each other's unrelated data.
// shm: in the cache line the waiting rank reads anyway (a round's `arrive`
// counter, an inline line). tcp: 24 bytes ahead of each message of a
// collective. No extra round trip, no store. Point-to-point operations have
// their own header (p2p_header.h).
//
// What cannot be seen this way: a rank that skips one of two identical
// collectives pairs with the next one, which looks the same.
#pragma once

#include <cstdint>
#include <string>

#include "comm/backend.h"

namespace lockstep {

// Collective, dtype, reduction and root in one word (rounds carry the full
// count beside it).
std::uint64_t stamp_what(const OpInfo& info);
// The count a stamp carries: the element count, or for per-rank-count
// collectives the digest of every rank's counts (which covers the total).
inline std::uint64_t stamp_count(const OpInfo& info) {
  return info.counts_digest != 0 ? info.counts_digest : info.count;
}
// The same and the count's low bits in 32 bits, for inline lines (whose
// operations carry at most 48 bytes, so their counts fit exactly).
std::uint32_t inline_stamp(const OpInfo& info);

// Throws MismatchError on this rank naming both operations when the
// stamp a peer posted is not this rank's operation's.
void check_round_stamp(const OpContext& op, std::uint64_t what, std::uint64_t count, int peer,
                       const std::string& self);
void check_inline_stamp(const OpContext& op, std::uint32_t stamp, int peer, const std::string& self);

// The stamp as bytes ahead of a tcp message: a magic word, what, count.
struct WireStamp {
  std::uint64_t magic = 0;
  std::uint64_t what = 0;
  std::uint64_t count = 0;
};
inline constexpr std::uint64_t kWireStampMagic = 0x706d6174736b636cull;  // "lckstamp"
WireStamp wire_stamp(const OpInfo& info);
// Checks a received wire stamp; a wrong magic means the peer was sending
// something else (another kind of operation, or data out of step).
void check_wire_stamp(const OpContext& op, const WireStamp& stamp, int peer, const std::string& self);

}  // namespace lockstep
