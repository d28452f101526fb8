// TcpStore wire protocol, shared by server and client.
//
// Every message is a frame: a u32 little-endian payload length, then the
// payload. The receiver checks the length against its limit *before*
// allocating, so a bad peer cannot make it allocate without bound.
//
// Request payload:  u8 opcode, then the opcode's fields.
// Reply payload:    u8 status (ok / error / timeout), then fields.
// Fields: strings are u32 length + bytes; integers are 8 bytes little endian.
//
//   auth      token                        -> ok | error(message)
//   set       key, value                   -> ok
//   get       key, timeout_ms              -> ok(value) | timeout(missing key)
//   add       key, delta                   -> ok(i64)
//   cas       key, expected, desired       -> ok(value)
//   wait      n, keys..., timeout_ms       -> ok | timeout(missing keys)
//   check     n, keys...                   -> ok(u8 all present)
//   erase     key                          -> ok(u8 existed)
//   num_keys                               -> ok(i64)
//
// A client's first request must be `auth`, with or without a token: before
// it the server reads no more than one auth message's bytes, and answers any
// other request (or a failed auth) with error and closes the connection.
// Reader/Writer are values; not shared.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::store_protocol {

inline constexpr std::uint32_t kMagic = 0x4c4b5354;  // "LKST", first field of auth

enum class Opcode : std::uint8_t { auth = 1, set, get, add, cas, wait, check, erase, num_keys };
enum class Status : std::uint8_t { ok = 0, error = 1, timeout = 2 };

class Writer {
 public:
  Writer& u8(std::uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i64(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  Writer& strings(const std::vector<std::string>& v) {
    u32(static_cast<std::uint32_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
  // The payload with its length prefix, ready to send.
  std::string frame() const {
    Writer w;
    w.u32(static_cast<std::uint32_t>(out_.size()));
    return w.out_ + out_;
  }

 private:
  std::string out_;
};

// Parses a payload; every read returns nullopt instead of reading past the end.
class Reader {
 public:
  explicit Reader(std::string_view payload) : p_(payload) {}

  std::optional<std::uint8_t> u8() {
    if (p_.size() < 1) return std::nullopt;
    const auto v = static_cast<std::uint8_t>(p_[0]);
    p_.remove_prefix(1);
    return v;
  }
  std::optional<std::uint32_t> u32() {
    if (p_.size() < 4) return std::nullopt;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p_[i])) << (8 * i);
    p_.remove_prefix(4);
    return v;
  }
  std::optional<std::int64_t> i64() {
    if (p_.size() < 8) return std::nullopt;
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p_[i])) << (8 * i);
    p_.remove_prefix(8);
    return static_cast<std::int64_t>(v);
  }
  std::optional<std::string> str(std::size_t max_len) {
    auto n = u32();
    if (!n || *n > max_len || p_.size() < *n) return std::nullopt;
    std::string s(p_.substr(0, *n));
    p_.remove_prefix(*n);
    return s;
  }
  std::optional<std::vector<std::string>> strings(std::size_t max_len) {
    auto n = u32();
    // Each string takes at least 4 bytes, which bounds a believable count.
    if (!n || *n > p_.size() / 4) return std::nullopt;
    std::vector<std::string> v;
    v.reserve(*n);
    for (std::uint32_t i = 0; i < *n; ++i) {
      auto s = str(max_len);
      if (!s) return std::nullopt;
      v.push_back(std::move(*s));
    }
    return v;
  }
  bool done() const { return p_.empty(); }

 private:
  std::string_view p_;
};

}  // namespace lockstep::store_protocol
