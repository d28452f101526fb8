// The launchers' store of `lockstep run`: a TcpStore hosted by one launcher
// (node 0 of a fixed job, or the launcher at the endpoint's address of an
// elastic one) and protected by a token, or etcd's (etcd_connection.h);
// the run id agreed there; what the others read from it when the nodes
// stop during the rendezvous; and reaching it again after it did not
// answer in time. Free functions; not thread-safe (they read the
// launcher's signalfd).
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "lockstep/store.h"
#include "run/interruption.h"
#include "run/job_plan.h"
#include "run/run_command.h"

namespace lockstep::cli {

// The launchers' store: etcd's, or a TcpStore, hosted by this launcher
// when it is the one at the endpoint (`server`). Sets the store's address
// and token in `job`; a launcher that does not host it waits for it to
// listen until `deadline`. Throws ConfigError when a store other hosts can
// reach would have no LOCKSTEP_STORE_TOKEN to protect it.
std::shared_ptr<Store> control_store(const RunOptions& o, const JobPlan& plan, bool single, JobIdentity& job,
                                     std::unique_ptr<TcpStoreServer>& server, Deadline deadline, int signal_fd);

// The one line that says what protects the store.
std::string store_protection(bool single, const JobPlan& plan);

// The run id: chosen by the first launcher at the store (the one that hosts
// it, `hosts_store`, in a fixed job), read by the others until `deadline`.
// `job` and `who` (this launcher, for the others' messages) say where and
// who waited when that fails.
std::string agree_run_id(Store& store, const RunOptions& o, const JobPlan& plan, bool hosts_store,
                         const JobIdentity& job, const std::string& who, Deadline deadline, int signal_fd);

// When the nodes stop during the rendezvous, the launcher hosting the store
// keeps it up a moment (while others are connected, 2 s at most) so they
// can read why. Null `server`: this launcher hosts none.
void keep_store_for_readers(TcpStoreServer* server);

// After a signal during the rendezvous: tell the other launchers why (under
// `key`; empty: nobody waits for this launcher).
void announce_interruption(Store& store, TcpStoreServer* server, const std::string& who, const Interrupted& e,
                           const std::string& key = kInterruptedKey);

// After the store did not answer in time (a partition, a switch that
// reboots, the store's host down): waits up to `within` (--rdzv-timeout)
// for it to accept connections again, saying so. False: it did not; the
// job cannot go on without it.
bool reach_store_again(Store& control, const JobIdentity& job, Duration within, int signal_fd);

}  // namespace lockstep::cli
