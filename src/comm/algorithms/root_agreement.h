// The rooted collectives' agreement check, over any Transport.
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
//
// Not thread-safe: runs on the progress thread.
#pragma once

#include "comm/transport.h"

namespace lockstep {

void check_root_agreement(Transport& transport, const OpContext& op);

}  // namespace lockstep
