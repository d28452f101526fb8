// What a rank of `lockstep run` is started with: its directory in
// torchrun's log layout, the program's MASTER_ADDR and MASTER_PORT (node 0
// chooses them each round), and the environment torchrun would give it
// plus lockstep's own. Free functions; not thread-safe (program_master
// reads the launcher's signalfd).
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/job_plan.h"
#include "run/run_arguments.h"
#include "run/run_command.h"

namespace lockstep::cli {

// torchrun's layout: <run dir>/attempt_<k>/<local rank>/ holds that rank's
// stdout.log, stderr.log and error.json; k is the round, which every node
// of the job shares (restarts and re-forms alike).
std::filesystem::path attempt_dir(const JobIdentity& job, const Round& round, int local);

// MASTER_ADDR and MASTER_PORT for a torch.distributed program, as torchrun's
// c10d rendezvous gives them: node 0's address and a port free there when
// the round starts, published in the store for the other nodes. As under
// torchrun, another process may take the port before the program's rank 0
// listens on it; a fresh one each round keeps that window short.
Endpoint program_master(Store& store, const Round& round, bool single, const std::string& local_addr, int signal_fd,
                        Deadline deadline);

// The environment torchrun gives a worker (plus lockstep's own), for local
// rank `local` of `round`. `failures`: restarts after failures so far
// (torchrun's TORCHELASTIC_RESTART_COUNT); LOCKSTEP_RESTART_COUNT is the
// round, which every node shares and which names the ranks' store keys.
// `incarnation`: which start of the rank in the round (0: the first; a
// replacement, --max-replacements, counts up: LOCKSTEP_INCARNATION).
std::map<std::string, std::string> rank_env(const RunOptions& o, const Round& round, int nproc, int local,
                                            const JobIdentity& job, const Endpoint& master, int failures,
                                            int incarnation = 0);

}  // namespace lockstep::cli
