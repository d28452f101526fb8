// The tcp backend's data pump. An algorithm describes its traffic as
// channels (a peer plus a byte source to send and/or a byte sink to fill),
// and run_transfer moves bytes on all of them at once with non-blocking
// sockets and poll(2) until every source is drained and every sink is full.
//
// Sources may produce bytes progressively (a ring forwards what it has just
// reduced), and sinks may consume them progressively (reduce each piece as it
// lands), which is how pipelining happens: there are no explicit segments,
// the kernel's socket buffers hold the data in flight.
//
// While waiting, run_transfer also watches every other peer's connection for
// a hang-up, so the death of any rank is reported within milliseconds as a
// PeerError naming it; a wait past the operation's deadline is a
// TimeoutError naming the peer waited for.
//
// Not thread-safe: runs on the group's progress thread.
#pragma once

#include <cstddef>
#include <span>

#include "comm/backend.h"
#include "comm/tcp/mesh.h"

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
  int peer = -1;
  ByteSource* send = nullptr;
  ByteSink* recv = nullptr;
};

void run_transfer(Mesh& mesh, const OpContext& op, std::span<const Channel> channels);

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
void exchange(Mesh& mesh, const OpContext& op, int peer, const void* send, std::size_t send_len, void* recv,
              std::size_t recv_len);
void send_bytes(Mesh& mesh, const OpContext& op, int peer, const void* data, std::size_t len);
void recv_bytes(Mesh& mesh, const OpContext& op, int peer, void* data, std::size_t len);

}  // namespace lockstep
