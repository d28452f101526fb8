// A TCP port held for a test until the server that is to listen on it has
// started, so that no other process can take it in between.
// Thread-safety: a value; move it, do not share it between threads.
#pragma once

#include <string>

namespace lockstep::testing {

// Why this instead of "bind port 0, close, return the number": between the
// close and the server's bind, any other test (or the kernel, handing out a
// port for an outgoing connection) could take the port, and the test fails
// with EADDRINUSE once in a few hundred runs on a busy machine.
//
// The port is bound here without SO_REUSEADDR (so the bind is exclusive and
// no other test's ReservedPort gets the same number), then SO_REUSEADDR is
// set on the bound socket. Linux lets another socket that sets SO_REUSEADDR
// bind the port as long as no socket on it listens: lockstep's listeners
// (common/socket.cc listen_tcp), and PyTorch's TCPStore, set it, so the
// server the number is handed to binds and listens, while sockets without
// the option (other tests' reservations, other programs) and the kernel's
// choice of ephemeral ports keep away. The socket never listens, so it takes
// no connections; holding it after the server has started is harmless.
//
// A forked child inherits the socket (harmless); exec'd programs do not
// (SOCK_CLOEXEC). Hold the ReservedPort for as long as the test runs.
class ReservedPort {
 public:
  ReservedPort();
  ~ReservedPort();
  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&&) = delete;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  int number() const { return number_; }
  std::string text() const { return std::to_string(number_); }

 private:
  int fd_ = -1;
  int number_ = 0;
};

}  // namespace lockstep::testing
