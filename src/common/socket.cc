// TCP socket helpers; see socket.h. Stateless; thread-safe per Socket.
#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* p) const { freeaddrinfo(p); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// Resolves host:port; an empty host means "any address" for a listener.
AddrInfoPtr resolve(const std::string& host, std::uint16_t port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    *error = gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoPtr(result);
}

std::string numeric_host(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return "?";
  return host;
}

bool retryable_connect_error(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET || err == EAGAIN || err == ECONNABORTED;
}

// One non-blocking connect attempt bounded by `deadline`. Returns the socket
// or an invalid one with *err set.
Socket try_connect(const addrinfo& ai, Deadline deadline, Os& os, int* err) {
  Socket s(::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol));
  if (!s.valid()) {
    *err = errno;
    return {};
  }
  set_nonblocking(s.fd());
  if (os.connect(s.fd(), ai.ai_addr, ai.ai_addrlen) == 0) return s;
  if (errno != EINPROGRESS) {
    *err = errno;
    return {};
  }
  pollfd p{s.fd(), POLLOUT, 0};
  const int rc = os.poll(&p, 1, poll_timeout_ms(os, deadline));
  if (rc == 0) {
    *err = ETIMEDOUT;
    return {};
  }
  int so_error = 0;
  socklen_t len = sizeof so_error;
  if (rc < 0 || getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) {
    *err = errno;
    return {};
  }
  if (so_error != 0) {
    *err = so_error;
    return {};
  }
  return s;
}

}  // namespace

std::string IoResult::describe() const {
  switch (status) {
    case IoStatus::ok: return "ok";
    case IoStatus::timeout: return "timed out";
    case IoStatus::closed: return "connection closed by peer";
    case IoStatus::error: return std::strerror(error);
  }
  return "?";
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_keepalive(int fd) {
  int one = 1, idle = 10, interval = 5, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

Socket listen_tcp(const std::string& host, std::uint16_t port, int backlog) {
  std::string error;
  auto addrs = resolve(host, port, /*passive=*/true, &error);
  if (!addrs)
    throw ConfigError(fmt::format("cannot listen on {}: cannot resolve '{}': {}",
                                  format_endpoint(host, port), host, error));
  int last_errno = 0;
  for (const addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      last_errno = errno;
      continue;
    }
    // SO_REUSEADDR lets a restarted job rebind a port left in TIME_WAIT; it
    // does not let two live listeners share a port.
    int one = 1;
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd(), backlog) != 0) {
      last_errno = errno;
      continue;
    }
    set_nonblocking(s.fd());
    return s;
  }
  std::string hint;
  if (last_errno == EADDRINUSE)
    hint = "; another process (a previous run, another job) is using the port: choose another port, "
           "or let `lockstep run` pick a free one";
  throw ConfigError(fmt::format("cannot listen on {}: {}{}", format_endpoint(host, port),
                                std::strerror(last_errno), hint));
}

Socket connect_tcp(const std::string& host, std::uint16_t port, Deadline deadline, Os& os) {
  auto backoff = std::chrono::milliseconds(10);
  std::string reason = "no address";
  for (;;) {
    std::string error;
    auto addrs = resolve(host, port, /*passive=*/false, &error);
    if (addrs) {
      for (const addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
        int err = 0;
        // Bound each attempt so a black-holed address does not eat the whole deadline.
        const Deadline attempt = Deadline::starting_at(os.now(), std::chrono::seconds(5));
        Socket s = try_connect(*ai, Deadline::earlier(deadline, attempt), os, &err);
        if (s.valid()) {
          set_nodelay(s.fd());
          return s;
        }
        reason = std::strerror(err);
        if (!retryable_connect_error(err)) break;
      }
    } else {
      reason = "cannot resolve '" + host + "': " + error;
    }
    if (expired(os, deadline)) break;
    os.sleep_for(std::min<Duration>(backoff, deadline.remaining_at(os.now())));
    backoff = std::min<Duration>(backoff * 2, std::chrono::seconds(1));
    if (expired(os, deadline)) break;
  }
  throw ConfigError(fmt::format("cannot connect to {}: {} (gave up after the connect timeout)",
                                format_endpoint(host, port), reason));
}

Socket accept_tcp(const Socket& listener, Deadline deadline, Os& os) {
  for (;;) {
    const int fd = os.accept(listener.fd(), SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      return Socket(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
      throw PeerError(fmt::format("accept failed: {}", std::strerror(errno)));
    pollfd p{listener.fd(), POLLIN, 0};
    const int rc = os.poll(&p, 1, poll_timeout_ms(os, deadline));
    if (rc == 0) return {};
  }
}

std::uint16_t local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

std::string local_host(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return numeric_host(addr, len);
}

std::string peer_host(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return numeric_host(addr, len);
}

bool is_loopback_host(const std::string& host) {
  if (host.empty()) return false;
  // "localhost" and "*.localhost" are loopback by definition (RFC 6761),
  // also where no /etc/hosts says so (a minimal container or chroot).
  std::string lower(host);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string_view suffix = ".localhost";
  if (lower == "localhost" ||
      (lower.size() > suffix.size() && lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) == 0))
    return true;
  std::string error;
  auto addrs = resolve(host, 0, /*passive=*/false, &error);
  if (!addrs) return false;
  for (const addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) return false;
    } else if (ai->ai_family == AF_INET6) {
      if (!IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr)) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string format_endpoint(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host.empty() ? "*" : host, port);
}

IoResult send_all(int fd, const void* data, std::size_t len, Deadline deadline, Os& os) {
  const auto* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = os.send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (errno == EPIPE || errno == ECONNRESET) return {IoStatus::closed, errno};
      return {IoStatus::error, errno};
    }
    pollfd p_fd{fd, POLLOUT, 0};
    const int rc = os.poll(&p_fd, 1, poll_timeout_ms(os, deadline));
    if (rc == 0) return {IoStatus::timeout, 0};
  }
  return {};
}

IoResult recv_all(int fd, void* data, std::size_t len, Deadline deadline, Os& os) {
  auto* p = static_cast<char*>(data);
  while (len > 0) {
    const ssize_t n = os.recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return {IoStatus::closed, 0};
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (errno == ECONNRESET) return {IoStatus::closed, errno};
      return {IoStatus::error, errno};
    }
    pollfd p_fd{fd, POLLIN, 0};
    const int rc = os.poll(&p_fd, 1, poll_timeout_ms(os, deadline));
    if (rc == 0) return {IoStatus::timeout, 0};
  }
  return {};
}

bool peer_hung_up(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace lockstep
