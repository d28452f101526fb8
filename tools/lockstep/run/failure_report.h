// How the launcher reports a failed attempt: the first failure on this node
// with its likely cause (a rank that left early), the rank's error file and
// last stderr lines; the one line other nodes read from the store; and the
// other nodes' reports, printed as they arrive. Free functions; not
// thread-safe (they write the launcher's stderr).
#pragma once

#include <cstddef>
#include <string>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/supervisor.h"

namespace lockstep::cli {

// Prints `f` on stderr: which rank failed first (or which node reported
// it), the likely cause, its error file and its last lines of stderr.
// `others`: the ranks of this node stopped because of it.
void print_failure(const RankFailure& f, int node_rank, int attempt, std::size_t others);

// `f` in one line, as the other nodes' launchers print it.
std::string failure_line(const RankFailure& f, int node_rank);

// Where the first failure of a round is reported (compare_set: the first
// report stays); every node stops its ranks when it appears.
std::string round_failed_key(int round);

// Where each node's launcher reports its own ranks' failure in a round
// (besides the first report of the job, which the others stop for).
std::string node_failed_key(int round, int node_rank);

// The failures the other nodes' launchers report for this round, printed as
// they arrive, for up to `patience`: each host's log then names every
// node's failure (a rank killed on one host makes its peers on the others
// fail too, and which node's report reaches the store first is a race).
void print_other_nodes_failures(Store& store, const Round& round, Duration patience);

}  // namespace lockstep::cli
