// The rendezvous of a job with a fixed node count (--nnodes N, --node-rank
// K): for each attempt every launcher claims its node under
// "launcher/<attempt>/node/<K>", publishes its process count under
// "launcher/<attempt>/nproc/<K>" and waits for every node's, which fixes the
// world size and each node's first global rank. Free function; not
// thread-safe (one per launcher, reading its signalfd).
#pragma once

#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/run_command.h"

namespace lockstep::cli {

// Agrees with the other launchers on the world of attempt `attempt` of a
// job with a fixed node count (--nnodes N, --node-rank K). One node needs
// no store. Throws ConfigError when another launcher was given the same
// --node-rank (every node then stops) or a node did not join within
// --rdzv-timeout; Interrupted on a signal.
Round rendezvous_static(Store& store, const RunOptions& o, int node_rank, int nnodes, int nproc, int attempt,
                        int signal_fd);

}  // namespace lockstep::cli
