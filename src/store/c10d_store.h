// A client of PyTorch's c10d TCPStore server (torch.distributed.TCPStore),
// such as the one torchrun's agent hosts on MASTER_ADDR:MASTER_PORT, behind
// lockstep's Store interface. Thread-safe: requests on one client are
// serialised by a mutex; clone() for a second connection.
//
// The wire protocol (PyTorch's, not lockstep's; there is no token):
//   request  opcode:u8, then per opcode strings (u64 length + bytes),
//            integers (i64) or key lists (u64 count + strings)
//   reply    per opcode: nothing (set), i64, u8, or u64 length + bytes
// All integers little-endian. Two generations exist, with different opcode
// numbers:
//   1.x   SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6,
//         DELETE_KEY 8; no handshake
//   2.x   VALIDATE 0 (+ u32 magic, no reply) must come first; then SET 1,
//         COMPARE_SET 2, GET 3, ADD 4, CHECK 5, WAIT 6, GETNUMKEYS 7,
//         DELETE_KEY 8, PING 13 (+ u32 nonce, echoed)
// The client tells them apart on its first connection (c10d_store.cc says
// how) and keeps the answer for reconnections and clones. Every key goes on
// the wire with a "/" in front, as PyTorch's own client sends it, so that a
// key set here is the same key for torch.distributed.TCPStore in Python.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/store.h"

namespace lockstep {

enum class C10dProtocol { detect, v1, v2 };

struct C10dStoreOptions {
  // How long to keep retrying to reach the server before a ConfigError.
  Duration connect_timeout = std::chrono::seconds(60);
  Duration timeout = Store::kDefaultTimeout;
  // detect: ask the server on the first connection.
  C10dProtocol protocol = C10dProtocol::detect;
  // Null: the real system calls (tests inject faults here).
  Os* os = nullptr;
};

class C10dStore final : public Store {
 public:
  // Connects (and learns the protocol) at once; throws ConfigError when the
  // server cannot be reached or does not speak either protocol.
  C10dStore(const std::string& host, std::uint16_t port, C10dStoreOptions options = {});
  ~C10dStore() override;

  // The largest key (with its "/") and value the client sends: the limits of PyTorch 2.x's
  // libuv server (it drops a client that goes over them), kept for every
  // server so that a program behaves the same under any. Over them:
  // InvalidArgument.
  static constexpr std::size_t kMaxKeyBytes = 8 * 1024;
  static constexpr std::size_t kMaxValueBytes = 8 * 1024 * 1024;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  std::shared_ptr<Store> clone() const override;
  std::string advertised_address() const override;

  // The protocol the server speaks (never `detect` after construction).
  C10dProtocol protocol() const;
  const std::string& host() const;
  std::uint16_t port() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep
