// The launcher of `lockstep run` on one node, once its options are planned
// (job_plan.h): the launchers' store, then the job's attempts, one round
// each, with restarts after failures and re-forms of an elastic group,
// until one succeeds or restarts run out. The protocol of one attempt is
// laid out in attempt_loop.cc. Not thread-safe: it owns the launcher's one
// thread and reads its signalfd.
#pragma once

#include "run/job_plan.h"
#include "run/run_command.h"

namespace lockstep::cli {

// Runs the job on this node with `nproc` ranks per attempt; `signal_fd`
// is the signalfd of the handled signals (and SIGCHLD). Returns the
// launcher's exit code: 0, the failed rank's, 1 when the failure was
// another node's or the store is gone, 128 + the signal that stopped the
// ranks. Throws Interrupted on a signal outside supervision, ConfigError
// when the nodes do not gather.
int run_nodes(const RunOptions& o, const JobPlan& plan, int nproc, int signal_fd);

}  // namespace lockstep::cli
