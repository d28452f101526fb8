// See op_stamp.h.
#include "comm/op_stamp.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep {
namespace {

// Roots are stored plus one, so "no root" (-1) is 0.
OpInfo unpack(std::uint64_t what, std::uint64_t count) {
  OpInfo info;
  info.collective = static_cast<Collective>(what & 0xff);
  info.dtype = static_cast<DType>((what >> 8) & 0xff);
  info.op = static_cast<ReduceOp>((what >> 16) & 0xff);
  if ((what >> 24) & 1) info.device = Device::cuda(0);  // the kind travels, not the index
  // A peer's stamp may hold anything (a corrupted stream): any 32-bit root
  // must decode without overflow.
  const auto root_plus_one = static_cast<std::uint32_t>(what >> 32);
  info.peer = root_plus_one == 0 ? -1 : static_cast<int>(std::min<std::uint32_t>(root_plus_one - 1, INT32_MAX));
  info.count = count;
  return info;
}

[[noreturn]] void refuse(const OpContext& op, const OpInfo& theirs, int peer, const std::string& self) {
  // A digest is no count: say what differs instead of printing it as one.
  if (op.info.counts_digest != 0 && theirs.collective == op.info.collective && theirs.dtype == op.info.dtype)
    throw MismatchError(fmt::format(
        "{}: {}: rank {} passed different per-rank counts for the same collective. Every rank must pass the same "
        "counts (each rank's count, in rank order); the data of this operation would be wrong, so it is refused",
        self, op.description(), peer));
  throw MismatchError(fmt::format(
      "{}: {} does not match what rank {} issued at the same point: {}. Every rank must issue the same "
      "collectives in the same order, with the same counts, dtypes, reductions and roots; the data of this "
      "operation would be wrong, so it is refused. Look for a collective that only some ranks run (a condition "
      "on the rank or on local data, an early exit from a loop)",
      self, op.description(), peer, describe(theirs, op.seq)));
}

}  // namespace

std::uint64_t stamp_what(const OpInfo& info) {
  return static_cast<std::uint64_t>(info.collective) | static_cast<std::uint64_t>(info.dtype) << 8 |
         static_cast<std::uint64_t>(info.op) << 16 | static_cast<std::uint64_t>(info.device.is_cuda()) << 24 |
         static_cast<std::uint64_t>(static_cast<std::uint32_t>(info.peer + 1)) << 32;
}

// 4 bits each for collective, dtype and reduction, 8 for the count, 11 for
// the root (plus one; larger roots wrap, the same way on every rank), 1 for
// CUDA memory.
std::uint32_t inline_stamp(const OpInfo& info) {
  return static_cast<std::uint32_t>(info.collective) | static_cast<std::uint32_t>(info.dtype) << 4 |
         static_cast<std::uint32_t>(info.op) << 8 | static_cast<std::uint32_t>(stamp_count(info) & 0xff) << 12 |
         (static_cast<std::uint32_t>(info.peer + 1) & 0x7ff) << 20 |
         static_cast<std::uint32_t>(info.device.is_cuda()) << 31;
}

void check_round_stamp(const OpContext& op, std::uint64_t what, std::uint64_t count, int peer,
                       const std::string& self) {
  if (what != stamp_what(op.info) || count != stamp_count(op.info)) refuse(op, unpack(what, count), peer, self);
}

void check_inline_stamp(const OpContext& op, std::uint32_t stamp, int peer, const std::string& self) {
  if (stamp == inline_stamp(op.info)) return;
  const std::uint64_t what = (stamp & 0xf) | ((stamp >> 4) & 0xf) << 8 | ((stamp >> 8) & 0xf) << 16 |
                             static_cast<std::uint64_t>(stamp >> 31) << 24 |
                             static_cast<std::uint64_t>((stamp >> 20) & 0x7ff) << 32;
  refuse(op, unpack(what, (stamp >> 12) & 0xff), peer, self);
}

WireStamp wire_stamp(const OpInfo& info) { return WireStamp{kWireStampMagic, stamp_what(info), stamp_count(info)}; }

void check_wire_stamp(const OpContext& op, const WireStamp& stamp, int peer, const std::string& self) {
  if (stamp.magic != kWireStampMagic)
    throw MismatchError(fmt::format("{}: {}: rank {} sent something other than a collective here (it is running "
                                    "a different operation, or its data is out of step with this rank's); every "
                                    "rank must issue the same collectives in the same order",
                                    self, op.description(), peer));
  check_round_stamp(op, stamp.what, stamp.count, peer, self);
}

}  // namespace lockstep
