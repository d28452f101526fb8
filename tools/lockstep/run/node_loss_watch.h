// --on-rank-failure continue across nodes, in a job of a fixed node count:
// a node whose launcher stops beating in the store (killed with its ranks,
// its host gone, or cut off from the store's host) is lost, not failed.
// Its ranks are marked ended (launcher_lost_key), so that the survivors'
// re-formed group (ProcessGroup::shrink) neither waits for them nor counts
// them in its majority, and the store's host does not wait for that node
// to finish. A node cut off from the store cannot go on by itself: every
// agreement of a re-formed group goes through the store, so its ranks
// stop and only the side with the store goes on.
//
// Keys, under launcher/<round>/: beat/<node> (a counter, Heartbeat),
// ranks/<node> ("<first rank> <count>"), finished/<node>, lost-node/<node>
// (its first marker's words), lost-nodes (a counter of lost nodes).
// Not thread-safe: polled from the launcher's one thread.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/heartbeat.h"

namespace lockstep::cli {

class NodeLossWatch {
 public:
  // Starts this node's heartbeat (on a clone of `store`) and publishes its
  // ranks.
  NodeLossWatch(Store& store, const Round& round, int nproc, KeepAlive keep_alive);

  // Marks the other nodes that have stopped beating lost, with a message
  // each. Returns why this node must stop its ranks: the store did not
  // answer within the time after which the others count this node lost
  // (it is cut off, and they go on without it), or is gone.
  std::optional<std::string> poll();
  // This node's ranks have finished: it is not lost when it stops beating.
  void mark_finished();

 private:
  void mark_lost(int node, Duration silent_for);

  std::shared_ptr<Store> store_;  // a clone that waits no longer than the silence limit
  Round round_;
  Heartbeat heartbeat_;
  SilenceWatch silence_;
  std::set<int> gone_;  // nodes lost or finished: no longer watched
};

// How many nodes of `round` were lost (NodeLossWatch); 0 outside that mode.
std::int64_t lost_node_count(Store& store, int round);

}  // namespace lockstep::cli
