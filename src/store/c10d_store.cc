// PyTorch c10d TCPStore client; see c10d_store.h for the wire format.
//
// Telling the generations apart. A 2.x server ignores or drops a client
// whose first request is not VALIDATE; a 1.x server reads VALIDATE's bytes
// as a SET and would block on the rest. So the first connection sends one
// message that both parse to the end:
//   0x00 | magic:u32 | 0x0D | nonce:u32 | 0x07 | 0x07          (12 bytes)
// 2.x reads VALIDATE, PING (it echoes the nonce) and GETNUMKEYS twice (two
// i64). 1.x reads SET with a key length of magic | 0x0D << 32 | nonce << 40;
// the nonce's third byte has its top bit set, so that length is over 2^63,
// the server's allocation for the key fails before it reads anything more,
// and it closes this connection and goes on serving the others. The
// client then reconnects and confirms 1.x with a GETNUMKEYS (opcode 6).
// Anything else (no answer in kProbeTimeout, other bytes) is not a
// PyTorch TCPStore this client knows: ConfigError.
//
// Semantics that differ from lockstep's Store contract, and how they are
// mapped:
//   compare_set  on a missing key with a non-empty expected value the server
//                answers `expected` without setting anything; the contract
//                says "" (see compare_set below).
//   wait         the reply is one byte when every key exists; there is no
//                server-side timeout. 1.x and 2.x's poll server do not wake
//                waiters when compare_set creates a key, and 2.x's libuv
//                server wakes them on a compare_set that leaves the key
//                missing: so a wait goes in one-second slices, each ended by
//                a check (2.x cancels a slice with CANCEL_WAIT; 1.x cannot,
//                so the connection is closed, which makes the server forget
//                the wait, and the next request reconnects).
//   get          the server has no blocking get (1.x and the 2.x non-libuv
//                server close the connection on a missing key): wait, then
//                get, as PyTorch's own client does.
//   add          on a key that does not hold an integer the server drops
//                the connection: PeerError.
// Every request waits at most the store's timeout for its answer; a wait,
// its own timeout (plus at most kAnswerGrace for the answers to its slices).
#include "store/c10d_store.h"

#include <mutex>
#include <random>

#include <fmt/format.h>

#include "common/socket.h"
#include "lockstep/error.h"
#include "store/key_value_map.h"
#include "store/store_errors.h"

namespace lockstep {
namespace {

constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;
constexpr std::uint8_t kValidate = 0;
constexpr std::uint8_t kPing = 13;
constexpr std::uint8_t kV1NumKeys = 6;
constexpr std::uint8_t kV2NumKeys = 7;
constexpr std::uint8_t kReady = 0;        // CHECK: every key exists (NOT_READY is 1)
constexpr std::uint8_t kStopWaiting = 0;  // WAIT: every key exists
constexpr std::uint8_t kV2CancelWait = 12;
constexpr std::uint8_t kWaitCanceled = 1;  // CANCEL_WAIT's answer
constexpr Duration kProbeTimeout = std::chrono::seconds(10);
// A wait is re-sent after this long (see State::wait).
constexpr Duration kWaitSlice = std::chrono::seconds(1);
// How long a request that the server answers at once may take.
constexpr Duration kAnswerGrace = std::chrono::seconds(30);
// A reply longer than this is taken for a broken stream.
constexpr std::uint64_t kMaxReplyBytes = 64u << 20;
// Keys named in a wait's timeout are looked up one by one; past this many
// the message would be unreadable anyway.
constexpr std::size_t kMaxMissingLookups = 64;

struct C10dOpcodes {
  std::uint8_t set, compare_set, get, add, check, wait, num_keys, delete_key;
};
constexpr C10dOpcodes kV1{0, 1, 2, 3, 4, 5, kV1NumKeys, 8};
constexpr C10dOpcodes kV2{1, 2, 3, 4, 5, 6, kV2NumKeys, 8};

// One request's bytes, little-endian as every server PyTorch runs on writes them.
class C10dRequest {
 public:
  explicit C10dRequest(std::uint8_t opcode) { u8(opcode); }
  C10dRequest& u8(std::uint8_t v) { return le(v, 1); }
  C10dRequest& u32(std::uint32_t v) { return le(v, 4); }
  C10dRequest& u64(std::uint64_t v) { return le(v, 8); }
  C10dRequest& i64(std::int64_t v) { return le(static_cast<std::uint64_t>(v), 8); }
  C10dRequest& str(std::string_view s) {
    u64(s.size());
    bytes_.append(s);
    return *this;
  }
  // A key as PyTorch's client sends it: with its "/" in front, so that this
  // client and PyTorch's see the same keys.
  C10dRequest& key(std::string_view k) {
    u64(k.size() + 1);
    bytes_.push_back('/');
    bytes_.append(k);
    return *this;
  }
  C10dRequest& keys(const std::vector<std::string>& keys) {
    u64(keys.size());
    for (const auto& k : keys) key(k);
    return *this;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  C10dRequest& le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  std::string bytes_;
};

std::uint64_t read_little_endian(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string c10d_keys_text(const std::vector<std::string>& keys) {
  return keys.size() == 1 ? fmt::format("key '{}'", keys.front()) : fmt::format("keys {}", quote_keys(keys));
}

void check_c10d_key(std::string_view key, const char* what) {
  if (key.size() + 1 > C10dStore::kMaxKeyBytes)
    throw InvalidArgument(fmt::format("{}: a key of {} bytes is over the {} bytes a PyTorch TCPStore accepts (with "
                                      "the '/' PyTorch's clients put in front)",
                                      what, key.size(), C10dStore::kMaxKeyBytes - 1));
}

void check_c10d_value(std::string_view value, const char* what, std::string_view key) {
  if (value.size() > C10dStore::kMaxValueBytes)
    throw InvalidArgument(fmt::format("{}('{}'): a value of {} bytes is over the {} bytes a PyTorch TCPStore accepts",
                                      what, key, value.size(), C10dStore::kMaxValueBytes));
}

}  // namespace

struct C10dStore::State {
  std::string host;
  std::uint16_t port = 0;
  C10dStoreOptions options;
  Os& os;
  mutable std::mutex mutex;
  Socket socket;

  State(std::string host_, std::uint16_t port_, C10dStoreOptions options_)
      : host(std::move(host_)),
        port(port_),
        options(std::move(options_)),
        os(options.os ? *options.os : Os::real()) {}

  std::string endpoint() const { return format_endpoint(host, port); }
  std::string name() const { return fmt::format("PyTorch TCPStore at {}", endpoint()); }
  Deadline after(Duration d) const { return Deadline::starting_at(os.now(), d); }
  const C10dOpcodes& ops() const { return options.protocol == C10dProtocol::v1 ? kV1 : kV2; }

  Socket open(Deadline deadline) {
    Socket s = connect_tcp(host, port, deadline, os);
    set_nonblocking(s.fd());
    set_nodelay(s.fd());
    set_keepalive(s.fd());
    return s;
  }

  // Opens the connection; on the first one, learns the protocol. Caller holds `mutex`.
  void connect() {
    const Deadline deadline = after(options.connect_timeout);
    if (options.protocol == C10dProtocol::detect) return detect(deadline);
    socket = open(deadline);
    if (options.protocol == C10dProtocol::v2) {
      const C10dRequest validate = C10dRequest(kValidate).u32(kValidateMagic);
      IoResult r = send_all(socket.fd(), validate.bytes().data(), validate.bytes().size(), deadline, os);
      if (r.status != IoStatus::ok) fail(r, "the handshake", {});
    }
  }

  void detect(Deadline deadline) {
    const Deadline probe_deadline = Deadline::earlier(deadline, after(kProbeTimeout));
    const std::uint32_t nonce = (std::random_device{}() & 0xff7fffffu) | 0x00800000u;  // third byte >= 0x80
    const C10dRequest probe = C10dRequest(kValidate).u32(kValidateMagic).u8(kPing).u32(nonce).u8(kV2NumKeys).u8(kV2NumKeys);
    Socket s = open(deadline);
    unsigned char reply[4 + 8 + 8];
    IoResult r = send_all(s.fd(), probe.bytes().data(), probe.bytes().size(), probe_deadline, os);
    if (r.status == IoStatus::ok) r = recv_all(s.fd(), reply, sizeof reply, probe_deadline, os);
    if (r.status == IoStatus::ok) {
      if (read_little_endian(reply, 4) != nonce)
        throw ConfigError(fmt::format("the server at {} answered lockstep's PyTorch TCPStore probe with bytes a "
                                      "TCPStore does not send; is MASTER_ADDR:MASTER_PORT torchrun's store?",
                                      endpoint()));
      options.protocol = C10dProtocol::v2;
      socket = std::move(s);
      return;
    }
    if (r.status == IoStatus::timeout)
      throw ConfigError(fmt::format("the server at {} did not answer lockstep's PyTorch TCPStore probe within {:.0f} s; "
                                    "is MASTER_ADDR:MASTER_PORT torchrun's store (PyTorch 1.x or 2.x)?",
                                    endpoint(), std::chrono::duration<double>(kProbeTimeout).count()));
    // Dropped: a 1.x server that could not parse the probe. Confirm.
    s.close();
    s = open(deadline);
    unsigned char count[8];
    const char num_keys = static_cast<char>(kV1NumKeys);
    r = send_all(s.fd(), &num_keys, 1, probe_deadline, os);
    if (r.status == IoStatus::ok) r = recv_all(s.fd(), count, sizeof count, probe_deadline, os);
    if (r.status != IoStatus::ok)
      throw ConfigError(fmt::format("the server at {} speaks neither PyTorch TCPStore protocol (1.x or 2.x): it "
                                    "dropped the 2.x handshake and then did not answer a 1.x request ({}); is "
                                    "MASTER_ADDR:MASTER_PORT torchrun's store?",
                                    endpoint(), r.describe()));
    options.protocol = C10dProtocol::v1;
    socket = std::move(s);
  }

  // Closes the connection (the stream is no longer at a message boundary)
  // and throws the error that fits.
  [[noreturn]] void fail(const IoResult& r, const char* what, std::string_view about) {
    socket.close();
    const std::string of = about.empty() ? std::string() : fmt::format(" of {}", about);
    if (r.status == IoStatus::timeout)
      throw TimeoutError(fmt::format("{}: no answer to {}{} within the store timeout; is the process hosting it "
                                     "(torchrun's agent) overloaded or stopped?",
                                     name(), what, of));
    throw PeerError(fmt::format("lost the connection to the {} during {}{} ({}); torchrun's agent, which hosts it, "
                                "has probably exited (or the server dropped a request it could not serve, such as "
                                "add on a key that does not hold an integer)",
                                name(), what, of, r.describe()));
  }

  void send(const C10dRequest& request, Deadline deadline, const char* what, std::string_view about) {
    if (!socket.valid()) connect();
    IoResult r = send_all(socket.fd(), request.bytes().data(), request.bytes().size(), deadline, os);
    if (r.status != IoStatus::ok) fail(r, what, about);
  }

  void receive(void* data, std::size_t len, Deadline deadline, const char* what, std::string_view about) {
    IoResult r = recv_all(socket.fd(), data, len, deadline, os);
    if (r.status != IoStatus::ok) fail(r, what, about);
  }

  std::uint64_t receive_u64(Deadline deadline, const char* what, std::string_view about) {
    unsigned char b[8];
    receive(b, sizeof b, deadline, what, about);
    return read_little_endian(b, 8);
  }

  std::uint8_t receive_u8(Deadline deadline, const char* what, std::string_view about) {
    unsigned char b = 0;
    receive(&b, 1, deadline, what, about);
    return b;
  }

  std::string receive_bytes(Deadline deadline, const char* what, std::string_view about) {
    const std::uint64_t len = receive_u64(deadline, what, about);
    if (len > kMaxReplyBytes) {
      socket.close();
      throw PeerError(fmt::format("{} sent a reply of {} bytes to {} of {}; the stream is broken", name(), len, what,
                                  about));
    }
    std::string value(len, '\0');
    receive(value.data(), value.size(), deadline, what, about);
    return value;
  }

  bool check(const std::vector<std::string>& keys, Deadline deadline) {
    if (keys.empty()) return true;
    send(C10dRequest(ops().check).keys(keys), deadline, "check", c10d_keys_text(keys));
    return receive_u8(deadline, "check", c10d_keys_text(keys)) == kReady;
  }

  // The keys of `keys` that do not exist, asked one by one (best effort:
  // all of them if the server cannot be asked).
  std::vector<std::string> missing(const std::vector<std::string>& keys) {
    std::vector<std::string> out;
    try {
      const Deadline deadline = after(std::chrono::seconds(5));
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (i == kMaxMissingLookups) {
          out.insert(out.end(), keys.begin() + static_cast<std::ptrdiff_t>(i), keys.end());
          break;
        }
        if (!check({keys[i]}, deadline)) out.push_back(keys[i]);
      }
    } catch (const Error&) {
      return keys;
    }
    return out;
  }

  // Ends this connection's wait: 2.x cancels it (the server may answer
  // STOP_WAITING first, if the keys came meanwhile); 1.x cannot, so the
  // connection is closed and the server forgets the wait with it.
  void cancel_wait(const std::string& about) {
    if (options.protocol == C10dProtocol::v1) return socket.close();
    const Deadline deadline = after(kAnswerGrace);
    send(C10dRequest(kV2CancelWait), deadline, "cancelling a wait", about);
    for (;;) {
      const std::uint8_t reply = receive_u8(deadline, "cancelling a wait", about);
      if (reply == kWaitCanceled) return;
      if (reply != kStopWaiting) {
        socket.close();
        throw PeerError(fmt::format("{} answered a cancelled wait with {}; the stream is broken", name(), int{reply}));
      }
    }
  }

  // Waits in slices: the server wakes a waiter on set and add, but 1.x and
  // 2.x's poll server not on a compare_set that creates the key; after each
  // slice a check sees such a key. A wake-up is checked too (2.x's libuv
  // server also wakes waiters on a compare_set that leaves the key missing).
  void wait(const std::vector<std::string>& keys, Duration timeout) {
    if (keys.empty()) return;
    const std::string about = c10d_keys_text(keys);
    const Deadline deadline = after(timeout);
    for (;;) {
      const Deadline slice = Deadline::earlier(deadline, after(kWaitSlice));
      send(C10dRequest(ops().wait).keys(keys), after(kAnswerGrace), "wait", about);
      unsigned char reply = 0;
      IoResult r = recv_all(socket.fd(), &reply, 1, slice, os);
      if (r.status == IoStatus::timeout) {
        cancel_wait(about);
      } else if (r.status != IoStatus::ok) {
        fail(r, "wait", about);
      } else if (reply != kStopWaiting) {
        socket.close();
        throw PeerError(fmt::format("{} answered a wait with {}; the stream is broken", name(), int{reply}));
      }
      if (check(keys, after(kAnswerGrace))) return;
      if (deadline.expired()) throw store_wait_timeout(name(), missing(keys), timeout);
    }
  }
};

C10dStore::C10dStore(const std::string& host, std::uint16_t port, C10dStoreOptions options)
    : state_(std::make_unique<State>(host, port, std::move(options))) {
  set_timeout(state_->options.timeout);
  std::lock_guard lock(state_->mutex);
  state_->connect();
}

C10dStore::~C10dStore() = default;

void C10dStore::set(std::string_view key, std::string_view value) {
  check_c10d_key(key, "set");
  check_c10d_value(value, "set", key);
  std::lock_guard lock(state_->mutex);
  state_->send(C10dRequest(state_->ops().set).key(key).str(value), state_->after(timeout()), "set",
               fmt::format("key '{}'", key));
}

std::string C10dStore::get(std::string_view key) {
  check_c10d_key(key, "get");
  std::lock_guard lock(state_->mutex);
  const Duration t = timeout();
  const Deadline deadline = state_->after(t);
  state_->wait({std::string(key)}, t);
  const std::string about = fmt::format("key '{}'", key);
  state_->send(C10dRequest(state_->ops().get).key(key), deadline, "get", about);
  return state_->receive_bytes(deadline, "get", about);
}

std::int64_t C10dStore::add(std::string_view key, std::int64_t delta) {
  check_c10d_key(key, "add");
  std::lock_guard lock(state_->mutex);
  const Deadline deadline = state_->after(timeout());
  const std::string about = fmt::format("key '{}'", key);
  state_->send(C10dRequest(state_->ops().add).key(key).i64(delta), deadline, "add", about);
  return static_cast<std::int64_t>(state_->receive_u64(deadline, "add", about));
}

std::string C10dStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  check_c10d_key(key, "compare_set");
  check_c10d_value(expected, "compare_set", key);
  check_c10d_value(desired, "compare_set", key);
  std::lock_guard lock(state_->mutex);
  const Deadline deadline = state_->after(timeout());
  const std::string about = fmt::format("key '{}'", key);
  state_->send(C10dRequest(state_->ops().compare_set).key(key).str(expected).str(desired), deadline,
               "compare_set", about);
  std::string now = state_->receive_bytes(deadline, "compare_set", about);
  // The server answers `expected` (non-empty) for a missing key it left
  // alone. A key that held `expected` would now hold `desired`, so the
  // answer is unambiguous unless the two are equal; then ask.
  if (!expected.empty() && now == expected &&
      (expected != desired || !state_->check({std::string(key)}, deadline)))
    return {};
  return now;
}

void C10dStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  for (const auto& k : keys) check_c10d_key(k, "wait");
  std::lock_guard lock(state_->mutex);
  state_->wait(keys, timeout);
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) check_c10d_key(k, "check");
  std::lock_guard lock(state_->mutex);
  return state_->check(keys, state_->after(timeout()));
}

bool C10dStore::delete_key(std::string_view key) {
  check_c10d_key(key, "delete_key");
  std::lock_guard lock(state_->mutex);
  const Deadline deadline = state_->after(timeout());
  const std::string about = fmt::format("key '{}'", key);
  state_->send(C10dRequest(state_->ops().delete_key).key(key), deadline, "delete_key", about);
  return state_->receive_u64(deadline, "delete_key", about) > 0;
}

std::int64_t C10dStore::num_keys() {
  std::lock_guard lock(state_->mutex);
  const Deadline deadline = state_->after(timeout());
  state_->send(C10dRequest(state_->ops().num_keys), deadline, "num_keys", {});
  return static_cast<std::int64_t>(state_->receive_u64(deadline, "num_keys", {}));
}

std::shared_ptr<Store> C10dStore::clone() const {
  C10dStoreOptions options;
  {
    std::lock_guard lock(state_->mutex);
    options = state_->options;  // the protocol is known by now
  }
  auto copy = std::make_shared<C10dStore>(state_->host, state_->port, options);
  copy->set_timeout(timeout());
  return copy;
}

std::string C10dStore::advertised_address() const {
  std::lock_guard lock(state_->mutex);
  return state_->socket.valid() ? local_host(state_->socket.fd()) : std::string();
}

C10dProtocol C10dStore::protocol() const {
  std::lock_guard lock(state_->mutex);
  return state_->options.protocol;
}

const std::string& C10dStore::host() const { return state_->host; }
std::uint16_t C10dStore::port() const { return state_->port; }

}  // namespace lockstep
