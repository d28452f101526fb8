// TcpStore client: one connection, requests serialised by a mutex. Blocking
// requests (get, wait) carry their timeout to the server, which answers
// "timeout" itself; the client waits a grace period longer so that a dead
// server is told apart from a missing key. Thread-safe.
#include <mutex>

#include <fmt/format.h>

#include "common/socket.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "store/key_value_map.h"
#include "store/store_errors.h"
#include "store/tcp_store_protocol.h"

namespace lockstep {
namespace {

namespace proto = store_protocol;
using proto::Opcode;
using proto::Status;

constexpr Duration kReplyGrace = std::chrono::seconds(30);

}  // namespace

struct TcpStore::State {
  std::string host;
  std::uint16_t port = 0;
  TcpStoreOptions options;
  Os& os;
  std::mutex mutex;
  Socket socket;

  State(std::string host_, std::uint16_t port_, TcpStoreOptions options_)
      : host(std::move(host_)),
        port(port_),
        options(std::move(options_)),
        os(options.os ? *options.os : Os::real()) {}

  std::string endpoint() const { return format_endpoint(host, port); }
  Deadline after(Duration d) { return Deadline::starting_at(os.now(), d); }

  void connect() {
    socket = connect_tcp(host, port, after(options.connect_timeout), os);
    set_nonblocking(socket.fd());
    set_keepalive(socket.fd());
    // Always authenticate: the server checks the magic number even without a
    // token, so a client pointed at the wrong port fails fast.
    std::string reply = round_trip(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::auth))
                                       .u32(proto::kMagic)
                                       .str(options.token),
                                   after(options.connect_timeout));
    proto::Reader rr(reply);
    if (rr.u8() != static_cast<std::uint8_t>(Status::ok)) {
      auto message = rr.str(reply.size());
      socket.close();
      throw ConfigError(fmt::format("store at {} refused this client: {}", endpoint(),
                                    message ? *message : std::string("no reason given")));
    }
  }

  // Sends one request and returns the reply payload. Caller holds `mutex`.
  std::string round_trip(const proto::Writer& request, Deadline deadline) {
    if (!socket.valid()) connect();
    const std::string frame = request.frame();
    IoResult r = send_all(socket.fd(), frame.data(), frame.size(), deadline, os);
    std::uint32_t len = 0;
    char header[4];
    if (r.status == IoStatus::ok) r = recv_all(socket.fd(), header, sizeof header, deadline, os);
    if (r.status == IoStatus::ok) {
      len = *proto::Reader(std::string_view(header, 4)).u32();
      if (len > options.max_value_bytes + 2 * options.max_key_bytes + 64) {
        socket.close();
        throw PeerError(fmt::format("store at {} sent a reply of {} bytes, over the limit; is that a lockstep store?",
                                    endpoint(), len));
      }
    }
    std::string payload(len, '\0');
    if (r.status == IoStatus::ok) r = recv_all(socket.fd(), payload.data(), len, deadline, os);
    if (r.status == IoStatus::ok) return payload;
    socket.close();  // the stream is no longer at a message boundary
    if (r.status == IoStatus::timeout)
      throw TimeoutError(fmt::format("store at {} did not answer in time; is the process hosting it "
                                     "(the launcher or rank 0) overloaded or stopped?", endpoint()));
    throw PeerError(fmt::format("lost the connection to the store at {} ({}); the process hosting it "
                                "(the launcher or rank 0) has probably exited or crashed",
                                endpoint(), r.describe()));
  }

  // A request whose reply is status ok plus fields; errors become exceptions.
  proto::Reader call(const proto::Writer& request, std::string& reply_storage, const char* what,
                     Duration wait = Duration(0)) {
    std::lock_guard lock(mutex);
    reply_storage = round_trip(request, after(wait + kReplyGrace));
    proto::Reader r(reply_storage);
    const auto status = r.u8();
    if (status == static_cast<std::uint8_t>(Status::ok)) return r;
    if (status == static_cast<std::uint8_t>(Status::timeout)) {
      auto missing = r.strings(options.max_key_bytes);
      throw store_wait_timeout(fmt::format("TcpStore {}", endpoint()), missing ? *missing : std::vector<std::string>{},
                               wait);
    }
    auto message = r.str(reply_storage.size());
    throw InvalidArgument(fmt::format("store {} at {}: {}", what, endpoint(), message ? *message : "error"));
  }

  [[noreturn]] void malformed(const char* what) const {
    throw PeerError(fmt::format("store at {} sent a malformed reply to {}", endpoint(), what));
  }
};

TcpStore::TcpStore(const std::string& host, std::uint16_t port, TcpStoreOptions options)
    : state_(std::make_unique<State>(host, port, std::move(options))) {
  set_timeout(state_->options.timeout);
  std::lock_guard lock(state_->mutex);
  state_->connect();
}

TcpStore::~TcpStore() = default;

void TcpStore::set(std::string_view key, std::string_view value) {
  std::string reply;
  state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::set)).str(key).str(value), reply, "set");
}

std::string TcpStore::get(std::string_view key) {
  std::string reply;
  const Duration t = timeout();
  auto r = state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::get)).str(key).i64(t.count()), reply,
                        "get", t);
  auto value = r.str(reply.size());
  if (!value) state_->malformed("get");
  return *value;
}

std::int64_t TcpStore::add(std::string_view key, std::int64_t delta) {
  std::string reply;
  auto r = state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::add)).str(key).i64(delta), reply, "add");
  auto v = r.i64();
  if (!v) state_->malformed("add");
  return *v;
}

std::string TcpStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  std::string reply;
  auto r = state_->call(
      proto::Writer().u8(static_cast<std::uint8_t>(Opcode::cas)).str(key).str(expected).str(desired), reply,
      "compare_set");
  auto v = r.str(reply.size());
  if (!v) state_->malformed("compare_set");
  return *v;
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::string reply;
  state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::wait)).strings(keys).i64(timeout.count()),
               reply, "wait", timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string reply;
  auto r = state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::check)).strings(keys), reply, "check");
  auto v = r.u8();
  if (!v) state_->malformed("check");
  return *v != 0;
}

bool TcpStore::delete_key(std::string_view key) {
  std::string reply;
  auto r = state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::erase)).str(key), reply, "delete_key");
  auto v = r.u8();
  if (!v) state_->malformed("delete_key");
  return *v != 0;
}

std::int64_t TcpStore::num_keys() {
  std::string reply;
  auto r = state_->call(proto::Writer().u8(static_cast<std::uint8_t>(Opcode::num_keys)), reply, "num_keys");
  auto v = r.i64();
  if (!v) state_->malformed("num_keys");
  return *v;
}

std::shared_ptr<Store> TcpStore::clone() const {
  auto copy = std::make_shared<TcpStore>(state_->host, state_->port, state_->options);
  copy->set_timeout(timeout());
  return copy;
}

std::string TcpStore::local_address() const {
  std::lock_guard lock(state_->mutex);
  return state_->socket.valid() ? local_host(state_->socket.fd()) : std::string();
}

const std::string& TcpStore::host() const { return state_->host; }
std::uint16_t TcpStore::port() const { return state_->port; }

}  // namespace lockstep
