// Fuzz target: bytes a stranger sends to the rendezvous store. A real
// TcpStoreServer (one per process, on loopback) receives each input on a
// new connection, exactly as it would from the network: frame lengths,
// the auth message, every request's fields. What must hold: the server
// neither crashes, nor reads out of bounds, nor stops serving; the check at
// the end of each input (a well-behaved client's set and get) proves the
// last.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <string>

#include "lockstep/store.h"

namespace {

lockstep::TcpStoreServer& server() {
  // One server for the whole run: starting one per input would measure
  // thread start-up, not the parser.
  static auto* s = [] {
    lockstep::TcpStoreOptions options;
    options.max_value_bytes = 1 << 16;  // small limits: the fuzzer reaches them
    options.max_key_bytes = 256;
    options.max_buffered_bytes = 1 << 20;
    return new lockstep::TcpStoreServer("127.0.0.1", 0, options);
  }();
  return *s;
}

// A connect interrupted by a signal goes on in the background: wait for it.
bool finish_interrupted_connect(int fd) {
  pollfd p{fd, POLLOUT, 0};
  while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
  }
  int error = 0;
  socklen_t len = sizeof error;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
  errno = error;
  return error == 0;
}

void send_as_stranger(const std::uint8_t* data, std::size_t size, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::abort();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  // Hundreds of thousands of short connections use up the local ports
  // (each lingers in TIME_WAIT): wait for one to free rather than call
  // that a failure. A refused connection means the server stopped
  // listening: that is one.
  for (int attempt = 0; ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0; ++attempt) {
    if (errno == EINTR && finish_interrupted_connect(fd)) break;  // libFuzzer's timer signal
    if ((errno != EADDRNOTAVAIL && errno != EAGAIN) || attempt == 1000) {
      std::fprintf(stderr, "store_frames_fuzz: cannot connect to the store: %s\n", std::strerror(errno));
      std::abort();
    }
    ::usleep(10000);
  }
  // A request may wait (get, wait) for a key nobody sets: read replies for
  // a moment only.
  timeval wait{0, 20000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server closed on us: a refused frame
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  while (::recv(fd, sink, sizeof sink, 0) > 0) {
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto& s = server();
  send_as_stranger(data, size, s.port());
  // Still serving a client that follows the protocol (one connection for
  // the run, opened after the first stranger).
  static auto* client = [&] {
    lockstep::TcpStoreOptions options;
    options.connect_timeout = std::chrono::seconds(5);
    options.timeout = std::chrono::seconds(5);
    return new lockstep::TcpStore("127.0.0.1", s.port(), options);
  }();
  client->set("fuzz/alive", std::to_string(size));
  if (client->get("fuzz/alive") != std::to_string(size)) std::abort();
  return 0;
}
