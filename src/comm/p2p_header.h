// The header in front of every point-to-point message, on every backend:
// what the sender sent (tag, dtype, byte count), so that a recv that does
// not match its send fails with both descriptions instead of reading the
// wrong bytes.
#pragma once

#include <cstdint>
#include <string>

#include "comm/backend.h"

namespace lockstep {

inline constexpr std::uint32_t kP2pMagic = 0x4c4b5032;  // "LKP2"

struct P2pHeader {
  std::uint32_t magic;
  std::int32_t tag;
  std::uint64_t bytes;
  std::uint8_t dtype;
  std::uint8_t reserved[7];
};

inline P2pHeader p2p_header(const ConstBuffer& data, int tag) {
  return P2pHeader{kP2pMagic, tag, data.bytes(), static_cast<std::uint8_t>(data.dtype), {}};
}

// Whether the sender sent what a recv of `data` with `tag` expects.
inline bool p2p_matches(const P2pHeader& header, const Buffer& data, int tag) {
  return header.tag == tag && header.bytes == data.bytes() && header.dtype == static_cast<std::uint8_t>(data.dtype);
}

// The MismatchError for a header that does not match; `self` is "rank r/n".
[[noreturn]] void throw_p2p_mismatch(const P2pHeader& header, const std::string& self, const OpContext& op, int src,
                                     const Buffer& data, int tag);

}  // namespace lockstep
