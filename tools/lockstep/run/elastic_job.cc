// start_elastic_rendezvous; see elastic_job.h.
#include "run/elastic_job.h"

#include <cstdint>

#include <fmt/format.h>

#include "common/host.h"
#include "common/socket.h"
#include "lockstep/error.h"
#include "run/run_arguments.h"

namespace lockstep::cli {

std::unique_ptr<ElasticRendezvous> start_elastic_rendezvous(Store& store, const RunOptions& o, const JobPlan& plan,
                                                            const JobIdentity& job, const std::string& store_name,
                                                            int nproc, int signal_fd) {
  ElasticOptions eo;
  eo.min_nodes = plan.nodes.min;
  eo.max_nodes = plan.nodes.max;
  eo.join_timeout = plan.join_timeout;
  eo.last_call = plan.last_call;
  eo.id = job.run_id;
  eo.endpoint = plan.etcd ? store_name : format_endpoint(job.store_addr, static_cast<std::uint16_t>(job.store_port));
  const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);  // checked by plan_job
  eo.keep_alive = eo.keep_alive.overridden_by(conf.keep_alive_interval, conf.keep_alive_max_attempt);
  auto elastic = std::make_unique<ElasticRendezvous>(store, eo, nproc, host_name(), signal_fd);
  // etcd keeps a job's keys until its lease runs out, after its last
  // launcher left: a new job under the same id would find it over.
  if (plan.etcd && store.check({"rdzv/finished"}))
    throw ConfigError(fmt::format("rendezvous '{}' in {} belongs to a job that has finished (etcd drops its keys "
                                  "about a minute after its last launcher left); choose another --rdzv-id",
                                  job.run_id, store_name));
  return elastic;
}

}  // namespace lockstep::cli
