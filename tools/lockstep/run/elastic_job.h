// The rendezvous of an elastic job (--nnodes MIN:MAX, --rdzv-backend c10d
// or etcd) as the launcher sets it up from its plan: the node range, the
// timeouts, the keep-alive of --rdzv-conf, and the check that an etcd
// rendezvous does not belong to a job that has finished. The rendezvous
// itself is elastic_rendezvous.h. Free function; not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/job_plan.h"
#include "run/run_command.h"

namespace lockstep::cli {

// The rendezvous this launcher joins each round through, in `store`, for
// job `job` (its run id); `store_name` names etcd in messages. Throws
// ConfigError when etcd still holds a finished job under this --rdzv-id.
std::unique_ptr<ElasticRendezvous> start_elastic_rendezvous(Store& store, const RunOptions& o, const JobPlan& plan,
                                                            const JobIdentity& job, const std::string& store_name,
                                                            int nproc, int signal_fd);

}  // namespace lockstep::cli
