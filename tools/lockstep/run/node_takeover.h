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
// In an elastic job under --on-rank-failure continue, a launcher that
// arrives while a round runs takes the place of a node of the round that
// the others counted lost (take_over_a_lost_node), with no --node-rank.
// A node still heard from is not taken: two launchers given one
// --node-rank stop the job, as before. Free functions; not thread-safe
// (they read the launcher's signalfd).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"

namespace lockstep::cli {

// What a launcher writes as its claim on a node: "host H (pid P)", naming
// it to a user and telling attempt_to_join whether it has ended.
std::string launcher_claim();

// The attempt of the job in the store that node `node_rank` joins: the
// latest one node 0 joined (0 when none has: a new job). Where this node
// is held in it and the job restarts (that attempt failed; or, where
// `restarts` says a death restarts the job, the holder is a launcher of
// this host that has ended, whose death the others have yet to see: this
// launcher marks the attempt failed, so that they restart now rather than
// when their ranks' rendezvous times out), waits until `deadline` for the
// next attempt to open and takes that one.
// Throws Interrupted on a signal.
int attempt_to_join(Store& store, int node_rank, bool restarts, Deadline deadline, int signal_fd);

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

// An elastic job (--nnodes MIN:MAX) under --on-rank-failure continue: each
// node of a round just formed says who holds it and how many ranks it runs,
// under the keys take_over_lost_node reads (a fixed job's rendezvous_static
// writes the same).
void publish_elastic_node(Store& store, const Round& round, int nproc);

// A launcher arriving at an elastic job under --on-rank-failure continue:
// while `elastic` says a round runs, takes the place of a node of that
// round that the others counted lost (the lowest), as take_over_lost_node
// does. A node that just died is counted lost within the keep-alive limit,
// so it waits for one: `wait_for_loss` where the round has room for this
// node (nullopt after it: the launcher joins the next round, and the job
// re-forms for it, as without continue), `join_timeout` where the round is
// full. nullopt at once where no round runs (one forms, or the job ended).
// Another launcher taking a node first is not an error: it tries the next.
// Throws ConfigError where the lost node ran another number of ranks,
// Interrupted on a signal.
std::optional<NodeTakeover> take_over_a_lost_node(Store& store, ElasticRendezvous& elastic, int nproc,
                                                  Duration wait_for_loss, int signal_fd);

}  // namespace lockstep::cli
