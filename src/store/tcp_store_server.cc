// TcpStoreServer: one thread, one poll(2) loop, any number of clients.
//
// Each client has an input buffer (bytes not yet parsed), an output buffer
// (replies not yet sent) and at most one blocked request (get or wait whose
// keys are missing). A client's requests are handled in order; while one is
// blocked, later bytes from it wait in its input buffer. After every pass the
// loop re-checks the blocked requests, so a set by one client releases the
// waiters of others.
//
// Limits, so that no client (authenticated or not) can make the server
// allocate without bound or take it down:
//   - before its auth message a client may send only that message: the
//     server reads at most one auth-sized frame from it, and a longer one
//     announced in a frame header closes the connection at once;
//   - a request is admitted when its header arrives only if its whole frame
//     fits in max_buffered_bytes beside what the server already holds for
//     others' requests; otherwise its client is disconnected. Reads never
//     take the total past the bound;
//   - while replies not yet taken exceed max_buffered_bytes, no further
//     request is answered (their clients wait; replies drain as clients
//     read). Gets that a set releases are answered at once all the same;
//   - a connection must authenticate within auth_timeout, or it is closed;
//     at most max_unauthenticated_per_address connections from one address
//     wait to authenticate (over it the oldest is closed), and at
//     max_clients the oldest unauthenticated connection makes room for a
//     new one: idle connections cannot starve clients that have the token;
//   - at most max_clients connections; when all have authenticated, a
//     further one is refused and closed;
//   - accept(2) failing (out of descriptors, memory, an aborted connection)
//     is logged and retried after a growing pause, never fatal.
// Every disconnect for a limit is logged with the peer and the reason.
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

// A buffer that grew past this for one large request is given back once empty.
constexpr std::size_t kKeptBufferBytes = 1u << 20;

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
  std::string peer;  // address, for log lines and the per-address limit
  Clock::time_point accepted{};
  std::string in;
  std::string out;
  // Bytes of the bound this client holds: its input, or the whole of the
  // frame whose header it has sent, whichever is larger.
  std::size_t held = 0;
  bool authenticated = false;  // sent a valid auth message (every client must)
  bool waiting_for_room = false;  // has a request, deferred while replies are over the bound
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
  Os* os = &Os::real();  // the system calls the loop makes (options.os when given)

  // Loop-thread state.
  std::list<Client> clients;
  KeyValueMap map;
  std::size_t held_bytes = 0;   // sum of clients' `held`
  std::size_t reply_bytes = 0;  // sum of clients' `out`
  // accept(2) failed: the listener is left out of poll until then.
  Clock::time_point accept_paused_until{};
  Duration accept_pause{0};
  bool refusing_clients = false;  // at max_clients; for logging once per episode
  std::uint64_t unauthenticated_closed = 0;  // for logging the first and every 1000th

  std::size_t max_frame() const { return options.max_value_bytes + 2 * options.max_key_bytes + 64; }
  // The longest auth payload: opcode, magic, and a token of at most max_key_bytes.
  std::size_t max_auth_frame() const { return 1 + 4 + 4 + options.max_key_bytes; }
  std::size_t frame_limit(const Client& c) const { return c.authenticated ? max_frame() : max_auth_frame(); }
  // Bytes this client may read now without going over its own or the total bound.
  std::size_t readable_bytes(const Client& c) const;
  void hold(Client& c, std::size_t bytes);

  void run();
  void accept_clients();
  void refuse(Socket s, const std::string& reason);
  void pause_accepting(int error);
  // Closes the connection from `peer` (any peer when empty) that has waited
  // longest without authenticating; false when there is none.
  bool close_oldest_unauthenticated(const std::string& peer, const char* why);
  void close_unauthenticated(Client& c, const std::string& why);
  void forget(Client& c);
  void read_from(Client& c);
  void write_to(Client& c);
  void handle_requests(Client& c);
  void handle(Client& c, std::string_view payload);
  void release_blocked(Client& c);
  // How long poll may wait, read on the clock reading `now`.
  int next_timeout_ms(Clock::time_point now) const;

  void reply(Client& c, const proto::Writer& w) {
    const std::string frame = w.frame();
    c.out += frame;
    reply_bytes += frame.size();
  }
  // Answers with an error and closes the connection once it is sent.
  void reject(Client& c, std::string_view message) {
    log.warn("TcpStoreServer: closing the connection from {}: {}", c.peer, message);
    reply(c, proto::Writer().u8(static_cast<std::uint8_t>(Status::error)).str(message));
    c.closing = true;
    c.in.clear();
    hold(c, 0);
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, std::uint16_t port, TcpStoreOptions options)
    : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
  if (state_->options.os) state_->os = state_->options.os;
  if (state_->options.max_buffered_bytes < state_->max_frame() + 4)
    throw InvalidArgument(fmt::format("TcpStoreOptions: max_buffered_bytes ({}) must hold at least one largest "
                                      "request ({} bytes, from max_value_bytes and max_key_bytes); raise it or "
                                      "lower max_value_bytes", state_->options.max_buffered_bytes,
                                      state_->max_frame() + 4));
  if (state_->options.max_clients == 0) throw InvalidArgument("TcpStoreOptions: max_clients must be at least 1");
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
    // A negative fd is skipped by poll: the listener rests after accept failed.
    // One reading of the clock decides both whether the listener rests and
    // how long poll waits: read twice, a pause that ended in between left
    // the listener out with no timeout to bring it back (a hang).
    const auto now = os->now();
    fds.push_back({now >= accept_paused_until ? listener.fd() : -1, POLLIN, 0});
    for (auto& c : clients) {
      short events = 0;
      // Stop reading from a client whose buffers are full: it must first
      // take its replies (or its blocked request must finish).
      if (!c.closing && readable_bytes(c) > 0 && c.out.size() <= max_frame()) events |= POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({c.socket.fd(), events, 0});
      polled.push_back(&c);
    }
    const int rc = os->poll(fds.data(), fds.size(), next_timeout_ms(now));
    if (rc < 0 && errno != EINTR) {
      // Out of memory for poll's table: wait and retry rather than stop serving.
      log.error("TcpStoreServer: poll failed: {}; retrying", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (stopping) break;
    if (fds[1].revents & POLLIN) accept_clients();
    for (std::size_t i = 0; i < polled.size(); ++i) {
      Client& c = *polled[i];
      if (c.dead) continue;  // closed to make room while accepting
      const short ev = fds[i + 2].revents;
      if (ev & (POLLIN | POLLHUP | POLLERR)) read_from(c);
      // Gone while its input is full: nothing more can be read to notice it,
      // and it can take no reply.
      if ((ev & (POLLHUP | POLLERR)) && readable_bytes(c) == 0) c.dead = true;
      if (!c.dead) handle_requests(c);
    }
    const auto after_poll = os->now();
    for (auto& c : clients) {
      if (!c.dead && !c.authenticated && Deadline::starting_at(c.accepted, options.auth_timeout).expired_at(after_poll))
        close_unauthenticated(c, fmt::format("it sent no valid auth message within {:.1f} s",
                                             std::chrono::duration<double>(options.auth_timeout).count()));
      if (!c.dead && c.blocked) release_blocked(c);
      if (!c.dead && c.waiting_for_room) handle_requests(c);
      if (!c.dead && !c.out.empty()) write_to(c);
      if (!c.dead && c.closing && c.out.empty()) c.dead = true;
      if (c.dead) forget(c);
    }
    const auto before = clients.size();
    clients.remove_if([](const Client& c) { return c.dead; });
    if (clients.size() != before) client_count = clients.size();
    if (refusing_clients && clients.size() < options.max_clients) {
      refusing_clients = false;
      log.warn("TcpStoreServer: accepting connections again ({} open, limit {})", clients.size(), options.max_clients);
    }
  }
}

int TcpStoreServer::State::next_timeout_ms(Clock::time_point now) const {
  int timeout = -1;
  if (accept_paused_until > now)
    timeout = Deadline::starting_at(now, std::chrono::duration_cast<Duration>(accept_paused_until - now))
                  .poll_timeout_ms_at(now);
  for (const auto& c : clients) {
    if (!c.authenticated) {  // wake to close it when its time to authenticate is up
      const int t = Deadline::starting_at(c.accepted, options.auth_timeout).poll_timeout_ms_at(now);
      if (t >= 0 && (timeout < 0 || t < timeout)) timeout = t;
    }
    // A deferred request goes on as soon as the replies fit again.
    if (c.waiting_for_room && reply_bytes <= options.max_buffered_bytes) return 0;
    if (!c.blocked) continue;
    const int t = c.blocked->deadline.poll_timeout_ms_at(now);
    if (t >= 0 && (timeout < 0 || t < timeout)) timeout = t;
  }
  return timeout;
}

// Accepts every pending connection. Errors are never fatal: a connection
// that failed before it was accepted is skipped, and running out of
// descriptors or memory pauses accepting (those connections stay queued in
// the kernel until descriptors are free again).
void TcpStoreServer::State::accept_clients() {
  for (;;) {
    const int fd = os->accept(listener.fd(), SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // The connection failed on its way in (see accept(2), "Error handling").
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == ENETDOWN || errno == ENOPROTOOPT ||
          errno == EHOSTDOWN || errno == ENONET || errno == EHOSTUNREACH || errno == ENETUNREACH || errno == EPERM)
        continue;
      return pause_accepting(errno);
    }
    Socket s(fd);
    set_nodelay(fd);
    const auto live = static_cast<std::size_t>(
        std::count_if(clients.begin(), clients.end(), [](const Client& c) { return !c.dead; }));
    if (live >= options.max_clients && !close_oldest_unauthenticated("", "to make room for a new connection")) {
      refuse(std::move(s), fmt::format("the store has {} connections open, its limit (TcpStoreOptions::max_clients); "
                                       "close unused store clients, or raise the limit",
                                       clients.size()));
      continue;
    }
    Client c;
    c.socket = std::move(s);
    c.peer = peer_host(fd);
    c.accepted = os->now();
    const auto waiting_from_peer = std::count_if(clients.begin(), clients.end(), [&](const Client& other) {
      return !other.dead && !other.authenticated && other.peer == c.peer;
    });
    if (static_cast<std::size_t>(waiting_from_peer) >= options.max_unauthenticated_per_address)
      close_oldest_unauthenticated(c.peer, "its address has too many connections that have not authenticated");
    clients.push_back(std::move(c));
    client_count = clients.size();
  }
  if (accept_pause > Duration(0)) {
    log.warn("TcpStoreServer: accepting connections again after accept(2) failed");
    accept_pause = Duration(0);
  }
}

bool TcpStoreServer::State::close_oldest_unauthenticated(const std::string& peer, const char* why) {
  Client* oldest = nullptr;
  for (auto& c : clients)
    if (!c.dead && !c.authenticated && (peer.empty() || c.peer == peer) && (!oldest || c.accepted < oldest->accepted))
      oldest = &c;
  if (oldest == nullptr) return false;
  close_unauthenticated(*oldest, why);
  return true;
}

// Marks the connection for removal at the end of this pass (the loop holds
// pointers to the clients it polled); logs the first and every 1000th.
void TcpStoreServer::State::close_unauthenticated(Client& c, const std::string& why) {
  if (unauthenticated_closed++ % 1000 == 0)
    log.warn("TcpStoreServer: closed a connection from {} that had not authenticated ({}; {} such so far). Something "
             "other than this job's ranks is connecting to the store's port",
             c.peer, why, unauthenticated_closed);
  c.dead = true;
}

// Tells a connection over the limit why, in the form a client reads as its
// auth reply, and closes it.
void TcpStoreServer::State::refuse(Socket s, const std::string& reason) {
  if (!refusing_clients) log.warn("TcpStoreServer: refusing new connections: {}", reason);
  refusing_clients = true;
  const std::string frame = proto::Writer().u8(static_cast<std::uint8_t>(Status::error)).str(reason).frame();
  [[maybe_unused]] auto n = os->send(s.fd(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Leaves the listener out of poll for a while: the failing accept would
// otherwise be retried in a busy loop, since the pending connection keeps
// the listener readable. The pause doubles up to a second while failures go on.
void TcpStoreServer::State::pause_accepting(int error) {
  constexpr Duration kFirstPause = std::chrono::milliseconds(10);
  constexpr Duration kLongestPause = std::chrono::seconds(1);
  if (accept_pause == Duration(0)) {
    const char* hint = (error == EMFILE || error == ENFILE)
                           ? "; the process hosting the store is out of file descriptors: raise `ulimit -n`"
                           : "";
    log.error("TcpStoreServer: accept failed: {}{}. Existing clients are still served; new connections wait "
              "and are accepted once this clears", std::strerror(error), hint);
    accept_pause = kFirstPause;
  } else {
    accept_pause = std::min(kLongestPause, accept_pause * 2);
  }
  accept_paused_until = os->now() + accept_pause;
}

void TcpStoreServer::State::forget(Client& c) {
  hold(c, 0);
  reply_bytes -= c.out.size();
  c.out.clear();
}

std::size_t TcpStoreServer::State::readable_bytes(const Client& c) const {
  const std::size_t own = frame_limit(c) + 4;
  const std::size_t own_room = c.in.size() < own ? own - c.in.size() : 0;
  // Room in the total: what is free, plus what is already reserved for this
  // client's current frame but not yet read.
  const std::size_t free_room = options.max_buffered_bytes - std::min(options.max_buffered_bytes, held_bytes);
  return std::min(own_room, free_room + (c.held - std::min(c.held, c.in.size())));
}

void TcpStoreServer::State::hold(Client& c, std::size_t bytes) {
  held_bytes = held_bytes - c.held + bytes;
  c.held = bytes;
}

void TcpStoreServer::State::read_from(Client& c) {
  char buf[64 * 1024];
  for (;;) {
    const std::size_t room = std::min(sizeof buf, readable_bytes(c));
    if (room == 0) return;  // parse (or wait for room) before reading more
    const ssize_t n = os->recv(c.socket.fd(), buf, room, MSG_DONTWAIT);
    if (n > 0) {
      c.in.append(buf, static_cast<std::size_t>(n));
      hold(c, std::max(c.held, c.in.size()));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.dead = true;
    return;
  }
}

void TcpStoreServer::State::write_to(Client& c) {
  while (!c.out.empty()) {
    const ssize_t n = os->send(c.socket.fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<std::size_t>(n));
      reply_bytes -= static_cast<std::size_t>(n);
      if (c.out.empty() && c.out.capacity() > kKeptBufferBytes) std::string().swap(c.out);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    c.dead = true;
    return;
  }
}

// Parses and answers the complete requests in the client's input, in order.
// A header is checked as soon as it arrives, before its payload is read.
void TcpStoreServer::State::handle_requests(Client& c) {
  c.waiting_for_room = false;
  while (!c.closing && !c.blocked && c.in.size() >= 4) {
    proto::Reader header(std::string_view(c.in).substr(0, 4));
    const std::size_t len = *header.u32();
    if (!c.authenticated && len > max_auth_frame())
      return reject(c, fmt::format("a client must first authenticate, with a message of at most {} bytes, but this "
                                   "one announced {} bytes; is it a lockstep store client?", max_auth_frame(), len));
    if (len > max_frame())
      return reject(c, fmt::format("request of {} bytes is over the store's limit of {} bytes", len, max_frame()));
    const std::size_t others = held_bytes - c.held;
    if (others + std::max(c.in.size(), 4 + len) > options.max_buffered_bytes)
      return reject(c, fmt::format("request of {} bytes does not fit: the store already holds {} bytes of other "
                                   "requests in flight, and its limit is {} (TcpStoreOptions::max_buffered_bytes)",
                                   len, others, options.max_buffered_bytes));
    hold(c, std::max(c.in.size(), 4 + len));  // the whole frame is admitted
    if (c.in.size() < 4 + len) return;
    if (reply_bytes > options.max_buffered_bytes) {
      c.waiting_for_room = true;  // answered once clients have taken more of their replies
      return;
    }
    const std::string payload = c.in.substr(4, len);
    c.in.erase(0, 4 + len);
    if (c.in.empty() && c.in.capacity() > kKeptBufferBytes) std::string().swap(c.in);
    hold(c, c.in.size());
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
  if (!c.authenticated && !options.token.empty())
    return reject(c, "this store requires a token: set LOCKSTEP_STORE_TOKEN to the job's token");
  if (!c.authenticated) return reject(c, "the first request must be auth; is this a lockstep store client?");

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
      const Duration wait(std::max<std::int64_t>(0, *timeout_ms));
      c.blocked = BlockedRequest{std::move(keys), Deadline::starting_at(os->now(), wait), is_get};
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
  } else if (expired(*os, b.deadline)) {
    reply(c, proto::Writer().u8(static_cast<std::uint8_t>(Status::timeout)).strings(missing));
    c.blocked.reset();
  }
  if (!c.blocked) handle_requests(c);
}

}  // namespace lockstep
