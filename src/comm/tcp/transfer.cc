// The poll(2)-driven data pump; see transfer.h.
#include "comm/tcp/transfer.h"

#include "comm/op_stamp.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include <fmt/format.h>

#include "common/enforce.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

bool would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

}  // namespace

PeerError lost_peer(const Mesh& mesh, const OpContext& op, int peer, const std::string& how) {
  if (mesh.departed(peer))
    return PeerError(fmt::format("{}: {}: rank {} left the group while this rank waited for it: it destroyed its "
                                 "process group (a clean exit, not a crash) having issued fewer collectives than this "
                                 "rank, or after a failure of its own. Every rank must issue the same collectives "
                                 "(e.g. the same number of steps); check rank {}'s output",
                                 mesh.self(), op.description(), peer, peer),
                     peer);
  return PeerError(fmt::format("{}: {}: lost rank {}: {}; its process exited, crashed or was killed. Check rank {}'s "
                               "output for the cause",
                               mesh.self(), op.description(), peer, how, peer),
                   peer);
}

namespace {

TimeoutError timed_out(const Mesh& mesh, const OpContext& op, std::span<const Channel> channels) {
  int peer = -1;
  const char* what = "";
  for (const auto& ch : channels) {
    if (ch.recv && !ch.recv->finished()) {
      peer = ch.peer;
      what = "for data from";
      break;
    }
  }
  if (peer < 0) {
    for (const auto& ch : channels) {
      if (ch.send && !ch.send->finished()) {
        peer = ch.peer;
        what = "for its data to be taken by";
        break;
      }
    }
  }
  return TimeoutError(
      fmt::format("{}: {} timed out after {:.1f} s waiting {} rank {}. Rank {} is stuck, slower than the timeout, or "
                  "issued a different sequence of collectives; if it is only slow, raise LOCKSTEP_TIMEOUT",
                  mesh.self(), op.description(), static_cast<double>(op.timeout.count()) / 1000.0, what, peer, peer),
      peer);
}

// Handles a hang-up seen on a connection this operation does not use. A
// peer that said goodbye left cleanly; one with unread data is left for the
// operation that reads that data to judge; otherwise it died.
void check_idle_peer(Mesh& mesh, const OpContext& op, int peer, std::vector<bool>& ignored) {
  int pending = 0;
  ioctl(mesh.fd(peer), FIONREAD, &pending);
  if (pending == 0) throw lost_peer(mesh, op, peer, "its connection closed while this rank waited on others");
  unsigned char first = 0;
  if (pending == 1 && mesh.os().recv(mesh.fd(peer), &first, 1, MSG_PEEK | MSG_DONTWAIT) == 1 &&
      first == Mesh::kGoodbyeByte)
    mesh.mark_departed(peer);
  ignored[static_cast<std::size_t>(peer)] = true;
}

// The collective check (op_stamp.h): a stamp goes ahead of what a source
// sends, and a sink takes the peer's stamp before any data and checks it.
// A rank that finds a mismatch still sends its own stamps (not its data)
// before it fails, so the peers it talks to find the mismatch too instead
// of waiting for data that will not come.
class StampedSource final : public ByteSource {
 public:
  StampedSource(const WireStamp& stamp, ByteSource* data, const std::exception_ptr& mismatch)
      : stamp_(stamp), data_(data), mismatch_(mismatch) {}
  std::span<const std::byte> ready() override {
    if (sent_ < sizeof stamp_) return {reinterpret_cast<const std::byte*>(&stamp_) + sent_, sizeof stamp_ - sent_};
    return mismatch_ ? std::span<const std::byte>{} : data_->ready();
  }
  void consumed(std::size_t n) override {
    if (sent_ < sizeof stamp_) sent_ += n;
    else data_->consumed(n);
  }
  bool finished() const override { return sent_ == sizeof stamp_ && (mismatch_ || data_->finished()); }

 private:
  WireStamp stamp_;
  ByteSource* data_;
  const std::exception_ptr& mismatch_;
  std::size_t sent_ = 0;
};

static_assert((kWireStampMagic & 0xff) != Mesh::kGoodbyeByte, "a stamp must not start like a goodbye");

class StampedSink final : public ByteSink {
 public:
  StampedSink(Mesh& mesh, const OpContext& op, int peer, ByteSink* data, std::exception_ptr& mismatch)
      : mesh_(mesh), op_(op), peer_(peer), data_(data), mismatch_(mismatch) {}
  std::span<std::byte> space() override {
    if (got_ < sizeof stamp_) return {reinterpret_cast<std::byte*>(&stamp_) + got_, sizeof stamp_ - got_};
    return data_->space();
  }
  void filled(std::size_t n) override {
    if (got_ >= sizeof stamp_) return data_->filled(n);
    // A stamp never starts with the goodbye byte (its magic starts with
    // 'l'): a peer that sent one in its place has left the group.
    if (got_ == 0 && *reinterpret_cast<const unsigned char*>(&stamp_) == Mesh::kGoodbyeByte) {
      mesh_.mark_departed(peer_);
      throw lost_peer(mesh_, op_, peer_, "it said goodbye");
    }
    got_ += n;
    if (got_ < sizeof stamp_) return;
    try {
      check_wire_stamp(op_, stamp_, peer_, mesh_.self());
    } catch (const MismatchError&) {
      if (!mismatch_) mismatch_ = std::current_exception();
    }
  }
  bool finished() const override { return mismatch_ || (got_ == sizeof stamp_ && data_->finished()); }

 private:
  Mesh& mesh_;
  const OpContext& op_;
  int peer_;
  ByteSink* data_;
  std::exception_ptr& mismatch_;
  WireStamp stamp_{};
  std::size_t got_ = 0;
};

void move_bytes(Mesh& mesh, const OpContext& op, std::span<const Channel> channels);

}  // namespace

// Collectives get their stamps; point-to-point operations carry their own
// header (send_recv.cc).
void run_transfer(Mesh& mesh, const OpContext& op, std::span<const Channel> channels) {
  if (op.info.collective == Collective::send || op.info.collective == Collective::recv) return move_bytes(mesh, op, channels);
  const WireStamp stamp = wire_stamp(op.info);
  std::exception_ptr mismatch;
  std::vector<StampedSource> sources;
  std::vector<StampedSink> sinks;
  sources.reserve(channels.size());
  sinks.reserve(channels.size());
  std::vector<Channel> stamped;
  for (const auto& ch : channels) {
    Channel c{ch.peer, nullptr, nullptr};
    if (ch.send) c.send = &sources.emplace_back(stamp, ch.send, mismatch);
    if (ch.recv) c.recv = &sinks.emplace_back(mesh, op, ch.peer, ch.recv, mismatch);
    stamped.push_back(c);
  }
  move_bytes(mesh, op, stamped);
  if (mismatch) std::rethrow_exception(mismatch);
}

namespace {

void move_bytes(Mesh& mesh, const OpContext& op, std::span<const Channel> channels) {
  std::vector<pollfd> fds;
  std::vector<int> watched_peer;  // peer of each watch-only entry in fds, after the channel entries
  std::vector<bool> ignored(static_cast<std::size_t>(mesh.size()), false);
  for (;;) {
    bool progressed = false;
    bool all_done = true;
    for (const auto& ch : channels) {
      if (ch.send && !ch.send->finished()) {
        all_done = false;
        const auto bytes = ch.send->ready();
        if (!bytes.empty()) {
          const ssize_t n = mesh.os().send(mesh.fd(ch.peer), bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
          if (n > 0) {
            ch.send->consumed(static_cast<std::size_t>(n));
            progressed = true;
          } else if (!would_block(errno)) {
            throw lost_peer(mesh, op, ch.peer, fmt::format("sending to it failed ({})", std::strerror(errno)));
          }
        }
      }
      if (ch.recv && !ch.recv->finished()) {
        all_done = false;
        const auto space = ch.recv->space();
        LOCKSTEP_ENFORCE(!space.empty(), "{}: a sink that is not finished offered no space", op.description());
        const ssize_t n = mesh.os().recv(mesh.fd(ch.peer), space.data(), space.size(), MSG_DONTWAIT);
        if (n > 0) {
          ch.recv->filled(static_cast<std::size_t>(n));
          progressed = true;
        } else if (n == 0) {
          throw lost_peer(mesh, op, ch.peer, "its connection closed");
        } else if (!would_block(errno)) {
          throw lost_peer(mesh, op, ch.peer, fmt::format("receiving failed ({})", std::strerror(errno)));
        }
      }
    }
    if (all_done) return;
    if (progressed) continue;

    // Nothing moved: wait for the sockets we need, and watch the others.
    fds.clear();
    watched_peer.clear();
    std::vector<bool> in_use(static_cast<std::size_t>(mesh.size()), false);
    for (const auto& ch : channels) {
      short events = 0;
      if (ch.send && !ch.send->finished() && !ch.send->ready().empty()) events |= POLLOUT;
      if (ch.recv && !ch.recv->finished()) events |= POLLIN;
      if (events == 0) continue;
      fds.push_back({mesh.fd(ch.peer), events, 0});
      in_use[static_cast<std::size_t>(ch.peer)] = true;
    }
    LOCKSTEP_ENFORCE(!fds.empty(), "{}: transfer stalled: nothing to send or receive yet not finished",
                     op.description());
    const std::size_t first_watch = fds.size();
    for (int p = 0; p < mesh.size(); ++p) {
      const auto i = static_cast<std::size_t>(p);
      if (p == mesh.rank() || in_use[i] || ignored[i] || mesh.departed(p) || mesh.fd(p) < 0) continue;
      fds.push_back({mesh.fd(p), POLLRDHUP, 0});
      watched_peer.push_back(p);
    }
    // Wake now and then to see whether the group aborted meanwhile (another
    // rank failed): then this operation is cancelled, not left to its deadline.
    const int wait_ms = poll_timeout_ms(mesh.os(), op.deadline, op.cancel ? kCancelCheckMs : -1);
    const int rc = mesh.os().poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) throw Error(fmt::format("{}: poll failed: {}", mesh.self(), std::strerror(errno)));
    if (op.cancelled()) throw OperationCancelled(fmt::format("{}: {} was cancelled", mesh.self(), op.description()));
    if (rc == 0) {
      if (expired(mesh.os(), op.deadline)) throw timed_out(mesh, op, channels);
      continue;
    }
    for (std::size_t i = first_watch; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR))
        check_idle_peer(mesh, op, watched_peer[i - first_watch], ignored);
    }
  }
}

}  // namespace

}  // namespace lockstep
