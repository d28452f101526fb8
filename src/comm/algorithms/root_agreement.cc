// The ring of stamps before a rooted collective; see root_agreement.h.
#include "comm/algorithms/root_agreement.h"

namespace lockstep {

void check_root_agreement(Transport& transport, const OpContext& op) {
  const int n = transport.size();
  if (n == 1) return;
  const int next = (transport.rank() + 1) % n;
  const int prev = (transport.rank() - 1 + n) % n;
  BufferSource nothing_to_send(nullptr, 0);  // the stamp goes ahead of it
  BufferSink nothing_to_receive(nullptr, 0);
  if (next == prev) {
    const Channel both{next, &nothing_to_send, &nothing_to_receive};
    transport.transfer(op, std::span(&both, 1));
    return;
  }
  const Channel channels[] = {{next, &nothing_to_send, nullptr}, {prev, nullptr, &nothing_to_receive}};
  transport.transfer(op, channels);
}

}  // namespace lockstep
