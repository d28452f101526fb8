// TcpStoreServer: one thread, one poll(2) loop, any number of clients.
//
// Each client has an input buffer (bytes not yet parsed), an output buffer
// (replies not yet sent) and at most one blocked request (get or wait whose
// keys are missing). A client's requests are handled in order; while one is
// blocked, later bytes from it wait in its input buffer. After every pass the
// loop re-checks the blocked requests, so a set by one client releases the
// waiters of others. Buffers are bounded: a frame longer than the limit closes
// the connection, and a client whose buffers are full is not read from.
//
// Thread-safety: the public methods may be called from any thread; the loop
// thread owns all client state.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/socket.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "store/key_value_map.h"
#include "store/tcp_store_protocol.h"

namespace lockstep {
namespace {

namespace proto = store_protocol;
using proto::Opcode;
using proto::Status;

// Constant-time comparison, so the token cannot be guessed byte by byte from
// response times.
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

struct BlockedRequest {
  std::vector<std::string> keys;
  Deadline deadline;
  bool is_get;  // get replies with the value; wait with ok
};

struct Client {
  Socket socket;
  std::string in;
  std::string out;
  bool authenticated = false;
  bool closing = false;  // close once `out` is flushed
  bool dead = false;
  std::optional<BlockedRequest> blocked;
};

}  // namespace

struct TcpStoreServer::State {
  TcpStoreOptions options;
  Socket listener;
  UniqueFd wake;  // eventfd: tells the loop to stop
  std::atomic<bool> stopping{false};
  std::atomic<std::size_t> client_count{0};
  std::thread loop;
  Logger log;

  // Loop-thread state.
  std::list<Client> clients;
  KeyValueMap map;

  std::size_t max_frame() const { return options.max_value_bytes + 2 * options.max_key_bytes + 64; }

  void run();
  void accept_clients();
  void read_from(Client& c);
  void write_to(Client& c);
  void handle_requests(Client& c);
  void handle(Client& c, std::string_view payload);
  void release_blocked(Client& c);
  int next_timeout_ms() const;

  static void reply(Client& c, const proto::Writer& w) { c.out += w.frame(); }
  void reject(Client& c, std::string_view message) {
    reply(c, proto::Writer().u8(static_cast<std::uint8_t>(Status::error)).str(message));
    c.closing = true;
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, std::uint16_t port, TcpStoreOptions options)
    : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
  state_->listener = listen_tcp(host, port);
  state_->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!state_->wake.valid()) throw Error(fmt::format("TcpStoreServer: eventfd: {}", std::strerror(errno)));
  state_->loop = std::thread([s = state_.get()] { s->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  state_->stopping = true;
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(state_->wake.fd(), &one, sizeof one);
  if (state_->loop.joinable()) state_->loop.join();
}

std::uint16_t TcpStoreServer::port() const { return local_port(state_->listener.fd()); }
std::size_t TcpStoreServer::num_clients() const { return state_->client_count.load(); }

void TcpStoreServer::State::run() {
  std::vector<pollfd> fds;
  std::vector<Client*> polled;
  while (!stopping) {
    fds.clear();
    polled.clear();
    fds.push_back({wake.fd(), POLLIN, 0});
    fds.push_back({listener.fd(), POLLIN, 0});
    for (auto& c : clients) {
      short events = 0;
      // Stop reading from a client whose buffers are full: it must first
      // take its replies (or its blocked request must finish).
      if (!c.closing && c.in.size() <= max_frame() + 4 && c.out.size() <= max_frame()) events |= POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({c.socket.fd(), events, 0});
      polled.push_back(&c);
    }
    const int rc = ::poll(fds.data(), fds.size(), next_timeout_ms());
    if (rc < 0 && errno != EINTR) {
      log.error("TcpStoreServer: poll failed: {}", std::strerror(errno));
      break;
    }
    if (stopping) break;
    if (fds[1].revents & POLLIN) accept_clients();
    for (std::size_t i = 0; i < polled.size(); ++i) {
      Client& c = *polled[i];
      const short ev = fds[i + 2].revents;
      if (ev & (POLLIN | POLLHUP | POLLERR)) read_from(c);
      if (!c.dead) handle_requests(c);
    }
    for (auto& c : clients) {
      if (!c.dead && c.blocked) release_blocked(c);
      if (!c.dead && !c.out.empty()) write_to(c);
      if (!c.dead && c.closing && c.out.empty()) c.dead = true;
    }
    const auto before = clients.size();
    clients.remove_if([](const Client& c) { return c.dead; });
    if (clients.size() != before) client_count = clients.size();
  }
}

int TcpStoreServer::State::next_timeout_ms() const {
  int timeout = -1;
  for (const auto& c : clients) {
    if (!c.blocked) continue;
    const int t = c.blocked->deadline.poll_timeout_ms();
    if (t >= 0 && (timeout < 0 || t < timeout)) timeout = t;
  }
  return timeout;
}

void TcpStoreServer::State::accept_clients() {
  for (;;) {
    Socket s = accept_tcp(listener, Deadline::after(Duration(0)));
    if (!s.valid()) return;
    set_nonblocking(s.fd());
    Client c;
    c.socket = std::move(s);
    c.authenticated = options.token.empty();
    clients.push_back(std::move(c));
    client_count = clients.size();
  }
}

void TcpStoreServer::State::read_from(Client& c) {
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::recv(c.socket.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      c.in.append(buf, static_cast<std::size_t>(n));
      if (c.in.size() > max_frame() + 4) return;  // parse before reading more
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.dead = true;
    return;
  }
}

void TcpStoreServer::State::write_to(Client& c) {
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.socket.fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    c.dead = true;
    return;
  }
}

void TcpStoreServer::State::handle_requests(Client& c) {
  while (!c.closing && !c.blocked && c.in.size() >= 4) {
    proto::Reader header(std::string_view(c.in).substr(0, 4));
    const std::uint32_t len = *header.u32();
    if (len > max_frame()) {
      reject(c, fmt::format("request of {} bytes is over the store's limit of {} bytes", len, max_frame()));
      return;
    }
    if (c.in.size() < 4 + static_cast<std::size_t>(len)) return;
    const std::string payload = c.in.substr(4, len);
    c.in.erase(0, 4 + static_cast<std::size_t>(len));
    handle(c, payload);
  }
}

// Dispatches one request. Malformed requests close the connection.
void TcpStoreServer::State::handle(Client& c, std::string_view payload) {
  proto::Reader r(payload);
  const auto op = r.u8();
  const std::size_t max_key = options.max_key_bytes;
  const std::size_t max_value = options.max_value_bytes;
  auto ok = [] { return proto::Writer().u8(static_cast<std::uint8_t>(Status::ok)); };

  if (!op) return reject(c, "empty request");
  if (static_cast<Opcode>(*op) == Opcode::auth) {
    const auto magic = r.u32();
    const auto token = r.str(max_key);
    if (!magic || *magic != proto::kMagic || !token) return reject(c, "not a lockstep store client");
    if (!options.token.empty() && !same_secret(*token, options.token))
      return reject(c, "wrong store token: every rank must use the job's LOCKSTEP_STORE_TOKEN");
    c.authenticated = true;
    return reply(c, ok());
  }
  if (!c.authenticated)
    return reject(c, "this store requires a token: set LOCKSTEP_STORE_TOKEN to the job's token");

  switch (static_cast<Opcode>(*op)) {
    case Opcode::set: {
      auto key = r.str(max_key);
      auto value = r.str(max_value);
      if (!key || !value) break;
      map.set(*key, *value);
      return reply(c, ok());
    }
    case Opcode::get:
    case Opcode::wait: {
      const bool is_get = static_cast<Opcode>(*op) == Opcode::get;
      std::vector<std::string> keys;
      if (is_get) {
        auto key = r.str(max_key);
        if (!key) break;
        keys.push_back(std::move(*key));
      } else {
        auto k = r.strings(max_key);
        if (!k) break;
        keys = std::move(*k);
      }
      auto timeout_ms = r.i64();
      if (!timeout_ms) break;
      c.blocked = BlockedRequest{std::move(keys), Deadline::after(Duration(std::max<std::int64_t>(0, *timeout_ms))), is_get};
      return release_blocked(c);
    }
    case Opcode::add: {
      auto key = r.str(max_key);
      auto delta = r.i64();
      if (!key || !delta) break;
      try {
        return reply(c, ok().i64(map.add(*key, *delta)));
      } catch (const InvalidArgument& e) {
        return reply(c, proto::Writer().u8(static_cast<std::uint8_t>(Status::error)).str(e.what()));
      }
    }
    case Opcode::cas: {
      auto key = r.str(max_key);
      auto expected = r.str(max_value);
      auto desired = r.str(max_value);
      if (!key || !expected || !desired) break;
      return reply(c, ok().str(map.compare_set(*key, *expected, *desired)));
    }
    case Opcode::check: {
      auto keys = r.strings(max_key);
      if (!keys) break;
      return reply(c, ok().u8(map.missing(*keys).empty() ? 1 : 0));
    }
    case Opcode::erase: {
      auto key = r.str(max_key);
      if (!key) break;
      return reply(c, ok().u8(map.erase(*key) ? 1 : 0));
    }
    case Opcode::num_keys:
      return reply(c, ok().i64(map.size()));
    default:
      break;
  }
  reject(c, fmt::format("malformed request (opcode {})", *op));
}

// Answers a blocked get/wait if its keys are all present or its deadline passed.
void TcpStoreServer::State::release_blocked(Client& c) {
  const BlockedRequest& b = *c.blocked;
  const auto missing = map.missing(b.keys);
  if (missing.empty()) {
    proto::Writer w;
    w.u8(static_cast<std::uint8_t>(Status::ok));
    if (b.is_get) w.str(*map.get(b.keys.front()));
    reply(c, w);
    c.blocked.reset();
  } else if (b.deadline.expired()) {
    reply(c, proto::Writer().u8(static_cast<std::uint8_t>(Status::timeout)).strings(missing));
    c.blocked.reset();
  }
  if (!c.blocked) handle_requests(c);
}

}  // namespace lockstep
