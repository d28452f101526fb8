// The rooted collectives' agreement check; see tcp_backend.h.
//
// A broadcast's root only sends and a reduce tree's leaves only send, so
// ranks that each name a different root may never read a stamp from each
// other: each root hands out its own data and returns, or every rank waits
// for a root that waits for someone else. Before the data, each rank sends
// its stamp (24 bytes, no data) to the next rank and checks the previous
// one's: if every neighbour agrees, every rank agrees. The ranks beside a
// disagreement raise MismatchError here; the others learn it from the
// group's first failure (group_diagnostics.h) within half a second. It
// costs one hop of latency, run in parallel on every link; rooted
// collectives are rare in a training step (docs/performance.md).
#include "comm/tcp/tcp_backend.h"
#include "comm/tcp/transfer.h"

namespace lockstep {

void TcpBackend::check_agreement_around_the_ring(const OpContext& op) {
  const int n = mesh_.size();
  if (n == 1) return;
  const int next = (mesh_.rank() + 1) % n;
  const int prev = (mesh_.rank() - 1 + n) % n;
  BufferSource nothing_to_send(nullptr, 0);  // the stamp goes ahead of it
  BufferSink nothing_to_receive(nullptr, 0);
  if (next == prev) {
    const Channel both{next, &nothing_to_send, &nothing_to_receive};
    run_transfer(mesh_, op, std::span(&both, 1));
    return;
  }
  const Channel channels[] = {{next, &nothing_to_send, nullptr}, {prev, nullptr, &nothing_to_receive}};
  run_transfer(mesh_, op, channels);
}

}  // namespace lockstep
