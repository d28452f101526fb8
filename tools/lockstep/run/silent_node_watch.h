// --on-rank-failure restart (the default) across the nodes of a fixed job:
// a node whose launcher stops beating in the store (killed with its ranks,
// its host gone, or cut off from the store's host) fails the attempt, so
// that every node restarts now. Without it a death is seen only when a
// rank fails, and ranks killed before they reached their peers fail no
// one: their peers wait in the rendezvous for its whole timeout (5 minutes
// by default). The beats are those of --on-rank-failure continue
// (node_loss_watch.h: launcher/<attempt>/beat/<node>, and finished/<node>
// for a node whose ranks all succeeded, which stops beating and is not
// silent), on torchrun's keep-alive unless --rdzv-conf sets it: a beat
// every 5 s, silent after 15 s.
// Not thread-safe: polled from the launcher's one thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/heartbeat.h"

namespace lockstep::cli {

class SilentNodeWatch {
 public:
  // Starts this node's beats on `round`'s key (a thread, on a clone of
  // `store`).
  SilentNodeWatch(Store& store, const Round& round, KeepAlive keep_alive);

  // Why the attempt fails: one of the next two nodes (in ring order) that
  // have not finished was silent for longer than the keep-alive limit.
  // Looks at most every half interval. The store not answering is not
  // this watch's to report: the round's watch (round_watch.h) says so.
  std::optional<std::string> poll();
  // This node's ranks have all succeeded: it stops beating, and says so.
  void mark_finished();

 private:
  std::shared_ptr<Store> store_;  // a clone that waits no longer than the silence limit
  Round round_;
  KeepAlive keep_alive_;
  Heartbeat heartbeat_;
  SilenceWatch silence_;
  std::optional<Clock::time_point> last_look_;
};

}  // namespace lockstep::cli
