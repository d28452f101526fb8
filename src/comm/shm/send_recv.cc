// shm point to point: each ordered pair of ranks has a mailbox of two slots
// in the sender's region. The sender copies a chunk into slot k % 2 once the
// receiver has taken chunk k - 2, then counts it sent; the receiver copies
// it out and counts it received. The first chunk of each message starts
// with a header (tag, dtype, bytes) the receiver checks.
//
// A recv from any source looks for a peer whose sent-to counter is ahead of
// what this rank took from it: that peer's next message has arrived, and it
// is received whole from there as from a named source. It cannot sleep on
// every peer's counter at once, so each sender also rings the receiver's
// doorbell (layout.h) after posting a message's first chunk.
#include <algorithm>
#include <cstring>

#include "comm/p2p_header.h"
#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  const auto* in = static_cast<const std::byte*>(data.data);
  std::size_t done = 0;
  bool first = true;
  std::uint64_t& k = p2p_chunks_sent_[static_cast<std::size_t>(dst)];
  while (first || done < data.bytes()) {
    if (k >= 2) waiter_.wait_at_least(p2p_received(dst, rank_), k - 1, dst, op, "to take an earlier message");
    std::byte* box = mailbox(rank_, dst, k);
    std::size_t offset = 0;
    if (first) {
      const P2pHeader h = p2p_header(data, tag);
      std::memcpy(box, &h, sizeof h);
      offset = sizeof h;
    }
    const std::size_t n = std::min(kMailboxBytes - offset, data.bytes() - done);
    to_slot(box + offset, in + done, n);
    done += n;
    p2p_sent(rank_, dst).post(++k);
    if (first) control(dst).p2p_doorbell.bump();
    first = false;
  }
}

void ShmBackend::recv(const OpContext& op, Buffer data, int src, int tag) {
  auto* out = static_cast<std::byte*>(data.data);
  std::size_t done = 0;
  bool first = true;
  std::uint64_t& k = p2p_chunks_received_[static_cast<std::size_t>(src)];
  while (first || done < data.bytes()) {
    waiter_.wait_at_least(p2p_sent(src, rank_), k + 1, src, op, "its message");
    const std::byte* box = mailbox(src, rank_, k);
    std::size_t offset = 0;
    if (first) {
      P2pHeader h{};
      std::memcpy(&h, box, sizeof h);
      if (!p2p_matches(h, data, tag)) throw_p2p_mismatch(h, self_, op, src, data, tag);
      offset = sizeof h;
    }
    const std::size_t n = std::min(kMailboxBytes - offset, data.bytes() - done);
    std::memcpy(out + done, box + offset, n);
    done += n;
    p2p_received(rank_, src).post(++k);
    first = false;
  }
}

int ShmBackend::peer_with_message(int after) const {
  for (int i = 1; i <= size_; ++i) {
    const int q = (after + i) % size_;
    if (q == rank_) continue;
    const std::uint64_t taken = p2p_chunks_received_[static_cast<std::size_t>(q)];
    if (p2p_sent(q, rank_).value.load(std::memory_order_acquire) > taken) return q;
  }
  return -1;
}

int ShmBackend::recv_any(const OpContext& op, Buffer data, int tag) {
  int source = peer_with_message(last_any_source_);
  if (source < 0) {
    std::vector<int> peers;
    for (int q = 0; q < size_; ++q)
      if (q != rank_) peers.push_back(q);
    waiter_.wait_for_any(
        control(rank_).p2p_doorbell, peers, [&] { return (source = peer_with_message(last_any_source_)) >= 0; }, op,
        "a message");
  }
  last_any_source_ = source;
  recv(op, data, source, tag);
  return source;
}

}  // namespace lockstep::shm
