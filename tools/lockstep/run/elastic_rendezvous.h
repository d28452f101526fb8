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
// Fewer than MIN by the join timeout: ConfigError naming who came. Not
// thread-safe (one per launcher).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "lockstep/store.h"

namespace lockstep::cli {

struct ElasticOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  Duration join_timeout = std::chrono::seconds(300);
  Duration last_call = std::chrono::seconds(3);
  std::string id;        // --rdzv-id, for messages
  std::string endpoint;  // the store's address, for messages
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

  Store& store_;
  ElasticOptions options_;
  int nproc_;
  std::string node_name_;
  int signal_fd_;
  std::string interruption_key_;
};

}  // namespace lockstep::cli
