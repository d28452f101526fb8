// --on-rank-failure continue in a job of several nodes, when every rank of
// this node has died while its launcher lives (killed, out of memory, its
// replacements spent). The other nodes' ranks were told of each death
// (launcher_lost_key) and go on without them, so the node is not the job's
// failure: its launcher keeps beating (NodeLossWatch's heartbeat runs on),
// node 0 keeps hosting the store, and it waits for the round's outcome.
// Before, it reported its ranks' deaths as the round's failure and every
// node stopped, though the survivors held all the state (docs/faults.md).
//
// Key, under launcher/<round>/: emptied (a counter of such nodes).
// Not thread-safe: called from the launcher's one thread.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"

namespace lockstep::cli {

struct RoundOutcome {
  enum class Kind {
    // A node finished, and every node has finished, been lost, or lost
    // every rank as this one did: the job is done; this node reports done
    // as a finished one does.
    kFinished,
    // No node finished, and every node was lost or lost every rank: the job
    // has no rank left; this node's deaths are the round's failure.
    kNoRankLeft,
    // The round's watch (round_watch.h, with the loss of other nodes) gave
    // a reason to stop: another node's failure, the store gone, a regroup.
    kStopped,
  };
  Kind kind = Kind::kFinished;
  std::string why;  // kStopped: the watch's reason
};

// Counts this node emptied and waits, polling `watch` (the supervisor's
// remote_failure of the attempt: it notes its reasons as during the
// attempt), until the round's outcome is known. Throws Interrupted on a
// handled signal.
RoundOutcome await_round_outcome(Store& store, const Round& round, int signal_fd,
                                 const std::function<std::optional<std::string>()>& watch);

}  // namespace lockstep::cli
