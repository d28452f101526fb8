// The tcp backend's connections: one TCP connection to every other rank of
// the group (a full mesh), so any algorithm can talk to any peer and every
// rank notices at once when any peer's process dies.
//
// Setup: each rank listens on an ephemeral port and publishes "host:port" in
// the group's store; rank i connects to every rank below it and accepts from
// every rank above it. Connecting never waits on the peer's accept (the
// listen backlog holds the connection), so setup cannot deadlock. A hello
// message carries a magic number, the group key, the world size and the
// rank, so a connection from another job or group is refused with a clear
// error.
//
// Shutdown: each rank sends a goodbye byte to every peer and waits (bounded)
// for theirs, so a rank that left on purpose is told apart from a crash.
//
// Not thread-safe: used by the group's progress thread only.
#pragma once

#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/transport.h"
#include "common/socket.h"

namespace lockstep {

// The mesh is the tcp Transport over every rank of the group (transfer()
// runs the poll loop of transfer.h).
class Mesh final : public Transport {
 public:
  explicit Mesh(const BackendContext& ctx);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void transfer(const OpContext& op, std::span<const Channel> channels) override;
  int fd(int peer) const { return peers_[static_cast<std::size_t>(peer)].fd(); }
  const Logger& log() const { return log_; }
  // The system calls every transfer on these connections makes.
  Os& os() const { return os_; }

  // True once the peer was seen to leave with a goodbye (see transfer.cc).
  bool departed(int peer) const { return departed_[static_cast<std::size_t>(peer)]; }
  void mark_departed(int peer) { departed_[static_cast<std::size_t>(peer)] = true; }

  // "rank 1/4"
  std::string self() const;

  void goodbye(Deadline deadline);

  static constexpr unsigned char kGoodbyeByte = 0xB7;

 private:
  void connect_lower(const BackendContext& ctx, Deadline deadline);
  void accept_higher(const BackendContext& ctx, const Socket& listener, Deadline deadline);

  int rank_;
  int size_;
  Logger log_;
  Os& os_;
  std::vector<Socket> peers_;  // peers_[rank_] is unused
  std::vector<bool> departed_;
};

}  // namespace lockstep
