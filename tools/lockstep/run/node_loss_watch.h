// --on-rank-failure continue across nodes, in a job of a fixed node count
// or an elastic one (whose round then runs on without the lost node):
// a node whose launcher stops beating in the store (killed with its ranks,
// its host gone, or cut off from the store's host) is lost, not failed.
// Its ranks are marked ended (launcher_lost_key), so that the survivors'
// re-formed group (ProcessGroup::shrink) neither waits for them nor counts
// them in its majority, and the store's host does not wait for that node
// to finish. A node cut off from the store cannot go on by itself: every
// agreement of a re-formed group goes through the store, so its ranks
// stop and only the side with the store goes on.
//
// A node that is lost can be taken over: a launcher started again with its
// --node-rank (on a new host, or the same one restarted) takes its place
// (take_over_lost_node, node_takeover.h) and its ranks join the running
// group as replacements. Each taking over is a new **generation** of the
// node; the watch looks at the node's latest one.
//
// Keys, under launcher/<round>/: beat/<node> (a counter, Heartbeat),
// ranks/<node> ("<first rank> <count>"), finished/<node>, generation/<node>
// (a counter, absent: 0), losing/<node>.<generation> (the launcher that
// marks that generation lost), lost-node/<node>.<generation> (its marker's
// words), lost-nodes (a counter of nodes lost and not taken over).
// Not thread-safe: polled from the launcher's one thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/heartbeat.h"

namespace lockstep::cli {

class NodeLossWatch {
 public:
  // Starts this node's heartbeat (on a clone of `store`) and publishes its
  // ranks. `generation`: 0 for the job's first launcher of the node, else
  // the one take_over_lost_node gave this launcher.
  // `tell_ranks`: where the ranks read another store than `store` (under
  // etcd, the round's own), also writes there the keys that mark a lost
  // node's ranks ended.
  using TellRanks = std::function<void(const std::string& key, const std::string& value)>;
  NodeLossWatch(Store& store, const Round& round, int nproc, KeepAlive keep_alive, int generation = 0,
                TellRanks tell_ranks = nullptr);

  // Marks the other nodes that have stopped beating lost, with a message
  // each. Returns why this node must stop its ranks: the store did not
  // answer within the time after which the others count this node lost
  // (it is cut off, and they go on without it), or is gone.
  std::optional<std::string> poll();
  // This node's ranks have finished: it is not lost when it stops beating.
  void mark_finished();

 private:
  void mark_lost(int node, int generation, Duration silent_for);

  std::shared_ptr<Store> store_;  // a clone that waits no longer than the silence limit
  Round round_;
  int generation_;
  TellRanks tell_ranks_;
  Heartbeat heartbeat_;
  SilenceWatch silence_;
  std::map<int, int> gone_;  // node -> its generation lost or finished: not watched until taken over
};

// How many nodes of `round` were lost and not taken over (NodeLossWatch);
// 0 outside that mode.
std::int64_t lost_node_count(Store& store, int round);

// The keys of node `node` of round `round` that taking it over reads and
// writes (node_takeover.h); described above.
namespace node_keys {
std::string beat(int round, int node);
std::string ranks(int round, int node);
std::string finished(int round, int node);
std::string generation(int round, int node);
std::string lost(int round, int node, int generation);
std::string lost_count(int round);
// Counters of the round's nodes whose ranks all finished (each launcher adds
// one when they did), and of those whose ranks all died (emptied_node.h).
std::string done(int round);
std::string emptied(int round);
}  // namespace node_keys

}  // namespace lockstep::cli
