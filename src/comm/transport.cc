// TransportSubset and the one-peer helpers; see transport.h.
#include "comm/transport.h"

#include <algorithm>

#include "common/enforce.h"

namespace lockstep {

TransportSubset::TransportSubset(Transport& base, std::vector<int> members)
    : base_(base), members_(std::move(members)) {
  const auto me = std::find(members_.begin(), members_.end(), base.rank());
  LOCKSTEP_ENFORCE(me != members_.end(), "a transport subset must contain this rank ({})", base.rank());
  rank_ = static_cast<int>(me - members_.begin());
}

void TransportSubset::transfer(const OpContext& op, std::span<const Channel> channels) {
  mapped_.assign(channels.begin(), channels.end());
  for (auto& ch : mapped_) ch.peer = members_[static_cast<std::size_t>(ch.peer)];
  base_.transfer(op, mapped_);
}

void exchange(Transport& transport, const OpContext& op, int peer, const void* send, std::size_t send_len, void* recv,
              std::size_t recv_len) {
  BufferSource source(send, send_len);
  BufferSink sink(recv, recv_len);
  const Channel ch{peer, &source, &sink};
  transport.transfer(op, std::span(&ch, 1));
}

void send_bytes(Transport& transport, const OpContext& op, int peer, const void* data, std::size_t len) {
  BufferSource source(data, len);
  const Channel ch{peer, &source, nullptr};
  transport.transfer(op, std::span(&ch, 1));
}

void recv_bytes(Transport& transport, const OpContext& op, int peer, void* data, std::size_t len) {
  BufferSink sink(data, len);
  const Channel ch{peer, nullptr, &sink};
  transport.transfer(op, std::span(&ch, 1));
}

}  // namespace lockstep
