// The launchers' store in etcd (--rdzv-backend etcd): connecting to the
// cluster named by --rdzv-endpoint and --rdzv-conf, and reaching it again
// after it did not answer in time. Built only with libcurl
// (LOCKSTEP_WITH_ETCD); include it under that guard. Free functions; not
// thread-safe (they read the launcher's signalfd).
#pragma once

#include <memory>

#include "common/clock.h"
#include "run/etcd_store.h"
#include "run/run_command.h"

namespace lockstep::cli {

// The launchers' store in etcd: every key of the job under
// /lockstep/<rdzv-id>/, on the job's lease. Waits for a member to answer
// until `deadline` (the join timeout), saying so. Throws ConfigError past
// it (or for a --rdzv-conf username without LOCKSTEP_ETCD_PASSWORD),
// Interrupted on a signal.
std::shared_ptr<EtcdStore> connect_etcd(const RunOptions& o, Deadline deadline, int signal_fd);

// After etcd did not answer in time: waits up to `within` (--rdzv-timeout)
// for a member to answer again, saying so. False: none did; the job cannot
// go on without it.
bool reach_etcd_again(EtcdStore& etcd, Duration within, int signal_fd);

}  // namespace lockstep::cli
