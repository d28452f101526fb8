// The rendezvous of an elastic job (--nnodes MIN:MAX): launchers on any
// number of nodes in MIN..MAX agree, through the store, on who takes part
// in the next round of the job, and in what order. Modelled on torchrun's
// dynamic rendezvous. Protocol (keys under "rdzv/"):
//   1. "round" holds the number of the round open for joining. A launcher
//      joins it by add("<r>/joined", 1), which gives it its node rank, and
//      publishes its process count under "<r>/node/<rank>".
//   2. Once at least MIN have joined, the round stays open for the last
//      call (more nodes may come), then closes: whoever sees it first
//      writes the count with compare_set("<r>/closed"), so every launcher
//      reads the same one. At MAX it closes at once.
//   3. A launcher that joined after the close (its rank >= the count)
//      adds itself to "<r>/waiting" and waits for the next round; the
//      running launchers see it and, below MAX, open round r+1 by
//      compare_set("round", r, r+1) and stop their ranks. A failure opens
//      the next round the same way.
//   4. "finished" tells launchers still waiting that the job is over.
//   5. A launcher interrupted while a round forms says so under
//      "<r>/interrupted", and the others stop (a round short of a node
//      would wait for it until the join timeout). One interrupted while
//      waiting to join a running job just leaves.
//   6. Heartbeats (heartbeat.h): from joining round r until it is over, a
//      launcher adds 1 to "<r>/beat/<its rank>" every keep_alive_interval.
//      Each watches the next two nodes of the round in rank order that
//      have not finished ("<r>/done/<rank>": all its ranks exited 0, and
//      it stops beating as it leaves), so every node is watched at
//      O(nodes) load on the store, reading their counters every half
//      interval, while the round forms and while it runs. A counter unchanged on the watcher's clock for
//      keep_alive_interval x keep_alive_max_attempt means that launcher is
//      gone (killed, frozen, cut off): the watcher writes who and for how
//      long under "<r>/lost" (the first word stays) and opens round r+1;
//      everyone else sees the round move on, reads why, stops its ranks and
//      joins r+1, without the silent node. A node that comes back (SIGCONT)
//      finds its round over the same way and joins again as a new node.
//      Under --on-rank-failure continue the launchers do not watch these
//      beats while the round runs: NodeLossWatch counts a silent node lost
//      and the round goes on without it (node_loss_watch.h), and a
//      launcher that arrives takes its place (node_takeover.h).
// Fewer than MIN by the join timeout: ConfigError naming who came. Not
// thread-safe (one per launcher).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/os.h"
#include "lockstep/store.h"
#include "run/heartbeat.h"

namespace lockstep::cli {

struct ElasticOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  Duration join_timeout = std::chrono::seconds(300);
  Duration last_call = std::chrono::seconds(3);
  std::string id;        // --rdzv-id, for messages
  std::string endpoint;  // the store's address, for messages
  KeepAlive keep_alive;
  // The clock the join timeout, the last call and heartbeat silences are
  // measured on (polls between looks are real time). Never null; tests
  // move a clock of their own.
  Os* clock = &Os::real();
};

struct Round {
  int number = 0;      // shared by every node: names the round's keys
  int node_rank = 0;   // GROUP_RANK
  int nnodes = 1;      // GROUP_WORLD_SIZE
  int world_size = 0;  // ranks over all nodes
  int first_rank = 0;  // this node's first global rank
};

class ElasticRendezvous {
 public:
  // `node_name` names this node in others' messages (its host name).
  ElasticRendezvous(Store& store, ElasticOptions options, int nproc, std::string node_name, int signal_fd);

  // Joins the open round and returns once it closed with this node in it.
  // Throws ConfigError when fewer than MIN join in time, Interrupted on a
  // signal, PeerError if another launcher was interrupted meanwhile;
  // returns nullopt if the job finished while this node waited to join.
  std::optional<Round> next_round();

  // Launchers waiting to join while `round` runs.
  std::int64_t nodes_waiting(const Round& round);
  // Opens the round after `round` (idempotent: every launcher may ask).
  void open_next_round(const Round& round);
  // Tells launchers still waiting to join that the job is over.
  void mark_finished();
  // This launcher is leaving: no more heartbeats, and their connection to
  // the store is closed.
  void stop_beating() { heartbeat_.stop(); }

  // The supervisor's periodic look at the running round: nullopt while it
  // goes on; otherwise why it is over for this node: a watched node stopped
  // beating (this launcher then opens the next round without it), or the
  // rendezvous moved on to another round (another launcher saw a node stop
  // beating, or a node waits to join). With `watch_peers` false (the job
  // goes on without lost nodes, which NodeLossWatch marks), only the
  // latter. Throws the store's Error.
  std::optional<std::string> watch(const Round& round, bool watch_peers = true);
  // The round running now (closed, the job not finished): its number and
  // node count only. nullopt while a round forms or after the job ended.
  std::optional<Round> running_round();
  // Notes, without a request to the store, that this launcher is polling
  // `round` now; call it before each poll's requests. If it did not poll
  // for longer than the keep-alive limit, or this poll has lasted longer
  // (it was stopped, before or amid its requests), pause_note() says so
  // until the next call.
  void note_poll(const Round& round);
  std::string pause_note() const;
  // True when, before the poll now under way, this launcher went longer
  // than the keep-alive limit without polling: it was stopped (SIGSTOP, a
  // suspended host). A poll that lasts that long inside its requests may
  // be cut off from the store as well.
  bool paused_before_poll() const { return paused_ != Duration{}; }
  // Once this node's ranks finished: says so, so that silent_before_done
  // does not wait for it.
  void mark_done(const Round& round);
  // For the launcher that waits for every node to finish before its store
  // goes: a node that stopped beating before it said it finished.
  std::optional<std::string> silent_before_done(const Round& round);
  // What the launcher that saw a node of `round` stop beating said, if one did.
  std::optional<std::string> lost_node(const Round& round);

  // Where to publish an interruption now: the round being formed, or ""
  // when this launcher is not forming one (it waits to join, or runs).
  const std::string& interruption_key() const { return interruption_key_; }

  const ElasticOptions& options() const { return options_; }

 private:
  enum class Joined { member, late, moved_on };
  int current_round();
  Joined join(int round, Deadline deadline, Round& out);
  Round layout(int round, int node_rank, int nnodes, Deadline deadline);
  // Waits until round `round` is no longer the open one; false if the job finished.
  bool wait_for_next_round(int round, Deadline deadline);
  [[noreturn]] void too_few(int round, std::int64_t joined);
  // Step 6: a look at the beats of `nodes` of round `round`, at most every
  // half interval; the silent one.
  std::optional<Silence> silent_node(int round, const std::vector<int>& nodes);
  // Says that node `s.node` of `round` stopped beating and opens the next
  // round; returns what the first launcher to notice said.
  std::string declare_lost(int round, const Silence& s);
  std::string host_of(int round, int node);

  Store& store_;
  ElasticOptions options_;
  int nproc_;
  std::string node_name_;
  int signal_fd_;
  std::string interruption_key_;
  Heartbeat heartbeat_;
  SilenceWatch silence_;
  int watched_round_ = -1;  // the round silence_ watches
  std::optional<Clock::time_point> last_look_;
  int polled_round_ = -1;
  std::optional<Clock::time_point> last_poll_;
  Duration paused_{};
};

}  // namespace lockstep::cli
