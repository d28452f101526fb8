// The wait of first_sender.h: peek at the head of every candidate's
// connection; while none holds a message, poll(2) them until bytes (or a
// hang-up) arrive, and peek at those again.
#include "comm/tcp/first_sender.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/p2p_header.h"
#include "comm/tcp/transfer.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

// What the head of a peer's connection holds.
enum class Head {
  nothing,  // no bytes yet
  message,  // a point-to-point message (its header's magic number)
  partial,  // the first bytes of one's magic number; the rest is on its way
  other,    // something else: a collective's stamp
  goodbye,  // the peer left the group
  closed,   // the connection closed with nothing unread
};

Head head_of(Mesh& mesh, const OpContext& op, int peer) {
  unsigned char bytes[sizeof kP2pMagic];
  const ssize_t n = mesh.os().recv(mesh.fd(peer), bytes, sizeof bytes, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return Head::closed;
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Head::nothing;
    throw lost_peer(mesh, op, peer, fmt::format("receiving failed ({})", std::strerror(errno)));
  }
  if (bytes[0] == Mesh::kGoodbyeByte) return Head::goodbye;
  if (std::memcmp(bytes, &kP2pMagic, static_cast<std::size_t>(n)) != 0) return Head::other;
  return static_cast<std::size_t>(n) == sizeof bytes ? Head::message : Head::partial;
}

// No peer is left that could send: some went on to a collective (a send to
// this rank is missing from their sequence), the others left.
[[noreturn]] void throw_nobody_can_send(const Mesh& mesh, const OpContext& op, std::vector<int> in_collective) {
  std::sort(in_collective.begin(), in_collective.end());
  if (in_collective.empty())
    throw PeerError(fmt::format("{}: {}: every other rank left the group while this rank waited for a message from "
                                "any of them: they destroyed their process groups (a clean exit, not a crash) having "
                                "sent fewer messages than this rank receives, or after a failure of their own. Check "
                                "their output",
                                mesh.self(), op.description()));
  throw MismatchError(fmt::format("{}: {}: rank(s) {} went on to a collective while this rank waits for a message "
                                  "from any rank, and no other rank can send one; the ranks issued different "
                                  "sequences of operations (a send to this rank is missing)",
                                  mesh.self(), op.description(), fmt::join(in_collective, ", ")));
}

}  // namespace

int first_sender(Mesh& mesh, const OpContext& op, int after) {
  const int n = mesh.size();
  // The peers that may still send the message, in the order they are looked at.
  std::vector<int> candidates;
  for (int i = 1; i <= n; ++i) {
    const int q = (after + i) % n;
    if (q != mesh.rank() && !mesh.departed(q) && mesh.fd(q) >= 0) candidates.push_back(q);
  }
  std::vector<int> in_collective;
  std::vector<bool> look(static_cast<std::size_t>(n), true);       // peek at this peer's head (again)
  std::vector<bool> hung_up(static_cast<std::size_t>(n), false);   // its connection closed: no more bytes will come
  std::vector<pollfd> fds;
  for (;;) {
    for (auto it = candidates.begin(); it != candidates.end();) {
      const int q = *it;
      if (!look[static_cast<std::size_t>(q)]) {
        ++it;
        continue;
      }
      switch (head_of(mesh, op, q)) {
        case Head::message: return q;
        case Head::nothing: ++it; continue;
        case Head::partial:
          if (hung_up[static_cast<std::size_t>(q)])
            throw lost_peer(mesh, op, q, "its connection closed in the middle of a message");
          ++it;
          continue;
        case Head::other: in_collective.push_back(q); break;
        case Head::goodbye: mesh.mark_departed(q); break;
        case Head::closed: throw lost_peer(mesh, op, q, "its connection closed");
      }
      it = candidates.erase(it);
    }
    if (candidates.empty()) throw_nobody_can_send(mesh, op, in_collective);

    fds.clear();
    for (int q : candidates) fds.push_back({mesh.fd(q), POLLIN | POLLRDHUP, 0});
    // Wake now and then to see whether the group aborted meanwhile.
    const int wait_ms = poll_timeout_ms(mesh.os(), op.deadline, op.cancel ? kCancelCheckMs : -1);
    const int rc = mesh.os().poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) throw Error(fmt::format("{}: poll failed: {}", mesh.self(), std::strerror(errno)));
    if (op.cancelled()) throw OperationCancelled(fmt::format("{}: {} was cancelled", mesh.self(), op.description()));
    if (rc <= 0) {
      if (expired(mesh.os(), op.deadline))
        throw TimeoutError(fmt::format(
            "{}: {} timed out after {:.1f} s waiting for a message from any of ranks {}, none of which sent one. "
            "They are stuck, slower than the timeout, or issued a different sequence of operations (no send to "
            "this rank); if they are only slow, raise LOCKSTEP_TIMEOUT",
            mesh.self(), op.description(), static_cast<double>(op.timeout.count()) / 1000.0,
            fmt::join(candidates, ", ")));
      std::fill(look.begin(), look.end(), false);
      continue;
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      const auto q = static_cast<std::size_t>(candidates[i]);
      look[q] = fds[i].revents != 0;
      if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) hung_up[q] = true;
    }
  }
}

}  // namespace lockstep
