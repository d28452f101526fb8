// TCP sockets for the store and the tcp backend: an owning fd, listen and
// connect with deadlines, and whole-buffer send/recv that wait with poll(2)
// so every wait is bounded. Addresses are IPv4 or IPv6, resolved with
// getaddrinfo. A Socket is move-only and not shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/os.h"
#include "common/unique_fd.h"

namespace lockstep {

// The calls that wait or move bytes take the Os to make them on (tests
// inject faults there); the deadlines are read on its clock.

// A TCP socket is an owning fd.
using Socket = UniqueFd;

// Why a socket operation failed, for callers that turn it into the right
// lockstep error (PeerError, ConfigError, TimeoutError).
enum class IoStatus { ok, timeout, closed, error };

struct IoResult {
  IoStatus status = IoStatus::ok;
  int error = 0;  // errno for IoStatus::error
  std::string describe() const;
};

// Binds and listens. Port 0 picks a free port. Throws ConfigError naming the
// address and the reason (e.g. "address already in use").
Socket listen_tcp(const std::string& host, std::uint16_t port, int backlog = 1024);

// Connects, retrying while the server is not up yet (refused, unreachable,
// timed out) until the deadline. Throws ConfigError naming the address and the
// last reason when the deadline passes.
Socket connect_tcp(const std::string& host, std::uint16_t port, Deadline deadline, Os& os = Os::real());

// Accepts one connection, waiting up to the deadline. Returns an invalid
// Socket on timeout.
Socket accept_tcp(const Socket& listener, Deadline deadline, Os& os = Os::real());

void set_nonblocking(int fd);
void set_nodelay(int fd);
// Keepalive probes so a peer host that vanished without closing (power loss,
// cable) is noticed in about half a minute rather than hours.
void set_keepalive(int fd);

std::uint16_t local_port(int fd);
// The local / remote address of a connected socket as a numeric host string.
std::string local_host(int fd);
std::string peer_host(int fd);
// True if `host` resolves only to loopback addresses (127.0.0.0/8, ::1),
// so a server for clients that connect to it needs to listen on nothing else.
bool is_loopback_host(const std::string& host);
// "host:port", with IPv6 hosts in brackets.
std::string format_endpoint(const std::string& host, std::uint16_t port);

// Send or receive exactly `len` bytes on a non-blocking socket, waiting with
// poll(2) until the deadline.
IoResult send_all(int fd, const void* data, std::size_t len, Deadline deadline, Os& os = Os::real());
IoResult recv_all(int fd, void* data, std::size_t len, Deadline deadline, Os& os = Os::real());

// Peer hang-up check without consuming data: true if the peer has closed or
// reset the connection.
bool peer_hung_up(int fd);

}  // namespace lockstep
