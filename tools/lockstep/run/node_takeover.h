// A launcher started for a node that the running job already has (a fixed
// node count, --nnodes N, --node-rank K): a node brought back after the job
// lost it. Two cases, both without stopping the others:
//   - the job restarted (--max-restarts) and waits for the node in a later
//     attempt: the launcher joins that attempt's rendezvous, as its first
//     launcher would have;
//   - under --on-rank-failure continue, the others counted the node lost
//     and went on (node_loss_watch.h): the launcher takes its place as the
//     node's next generation, and its ranks start as replacements, which
//     join the running group at its next step boundary and are fed their
//     state from their peers' memory (docs/faults.md).
// A node still heard from is not taken: two launchers given one
// --node-rank stop the job, as before. Free functions; not thread-safe
// (they read the launcher's signalfd).
#pragma once

#include <optional>
#include <vector>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"

namespace lockstep::cli {

// The attempt of the job in the store that node `node_rank` joins: the
// latest one node 0 joined (0 when none has: a new job). Where this node
// is held in it and that attempt failed (the job restarts), waits until
// `deadline` for the next attempt to open and takes that one. Throws
// Interrupted on a signal.
int attempt_to_join(Store& store, int node_rank, Deadline deadline, int signal_fd);

struct NodeTakeover {
  Round round;                    // the running attempt, as the lost node had it
  int generation = 0;             // this launcher's generation of the node (>= 1)
  std::vector<int> incarnations;  // per local rank: its start in the round (>= 1)
};

// Where node `node_rank` of `attempt` is held by another launcher and the
// job watches for lost nodes (--on-rank-failure continue), waits up to
// `wait_for_loss` for the others to count it lost, then takes its place.
// nullopt: the node is not held (join the attempt's rendezvous) or not
// watched (two launchers given one --node-rank: rendezvous_static says so).
// Throws ConfigError when the holder is still heard from after the wait,
// another launcher took the node first, this launcher's process count
// differs from the lost node's, or the node had finished; Interrupted on a
// signal.
std::optional<NodeTakeover> take_over_lost_node(Store& store, int node_rank, int nnodes, int nproc, int attempt,
                                                Duration wait_for_loss, int signal_fd);

}  // namespace lockstep::cli
