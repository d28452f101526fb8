// The point-to-point transport the collective algorithms (algorithms/: ring,
// recursive doubling, broadcast tree and chain) are written against, so one
// implementation of each serves the tcp backend and hier's cross-host step.
//
// A transport connects a *set* of ranks, numbered 0..size()-1 within the
// set. An algorithm describes its traffic as channels (a peer index plus a
// byte source to send and/or a byte sink to fill) and transfer() moves bytes
// on all of them at once until every source is drained and every sink full.
// Sources may produce bytes progressively (a ring forwards what it has just
// reduced) and sinks may consume them progressively (reduce each piece as it
// lands): that is how algorithms pipeline without explicit segments.
//
// transfer() honours the operation's deadline (TimeoutError naming the peer
// waited for) and cancel flag (OperationCancelled), and reports a lost peer
// as PeerError naming it. Implementations: the tcp mesh (tcp/mesh.h) and
// TransportSubset (a view of some of another transport's ranks).
//
// Not thread-safe: a transport is driven by the group's progress thread.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "comm/backend.h"

namespace lockstep {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Bytes that may be sent now (empty while waiting for them to be produced).
  virtual std::span<const std::byte> ready() = 0;
  virtual void consumed(std::size_t n) = 0;
  virtual bool finished() const = 0;
};

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  // Where the next bytes go; never empty while not finished.
  virtual std::span<std::byte> space() = 0;
  virtual void filled(std::size_t n) = 0;
  virtual bool finished() const = 0;
};

struct Channel {
  int peer = -1;  // index within the transport's set of ranks
  ByteSource* send = nullptr;
  ByteSink* recv = nullptr;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // This rank's index in the set, and the set's size.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void transfer(const OpContext& op, std::span<const Channel> channels) = 0;
};

// The ranks `members` (indices into `base`, this rank among them) of another
// transport, renumbered 0..members.size()-1 in the order given. Failure
// messages keep the base's rank numbers, which are the group's.
class TransportSubset final : public Transport {
 public:
  TransportSubset(Transport& base, std::vector<int> members);
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  void transfer(const OpContext& op, std::span<const Channel> channels) override;

 private:
  Transport& base_;
  std::vector<int> members_;
  int rank_ = -1;
  std::vector<Channel> mapped_;  // reused between transfers
};

// A fixed buffer sent in full.
class BufferSource final : public ByteSource {
 public:
  BufferSource(const void* data, std::size_t len) : data_(static_cast<const std::byte*>(data)), len_(len) {}
  std::span<const std::byte> ready() override { return {data_ + done_, len_ - done_}; }
  void consumed(std::size_t n) override { done_ += n; }
  bool finished() const override { return done_ == len_; }

 private:
  const std::byte* data_;
  std::size_t len_;
  std::size_t done_ = 0;
};

// A fixed buffer received in full.
class BufferSink final : public ByteSink {
 public:
  BufferSink(void* data, std::size_t len) : data_(static_cast<std::byte*>(data)), len_(len) {}
  std::span<std::byte> space() override { return {data_ + done_, len_ - done_}; }
  void filled(std::size_t n) override { done_ += n; }
  bool finished() const override { return done_ == len_; }
  std::size_t received() const { return done_; }

 private:
  std::byte* data_;
  std::size_t len_;
  std::size_t done_ = 0;
};

// Convenience: exchange buffers with one peer (both directions at once).
void exchange(Transport& transport, const OpContext& op, int peer, const void* send, std::size_t send_len, void* recv,
              std::size_t recv_len);
void send_bytes(Transport& transport, const OpContext& op, int peer, const void* data, std::size_t len);
void recv_bytes(Transport& transport, const OpContext& op, int peer, void* data, std::size_t len);

}  // namespace lockstep
