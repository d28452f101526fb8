// plan_job: the options of `lockstep run` checked against each other; see
// job_plan.h.
#include "run/job_plan.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

// torchrun options that do not carry over, each refused with its reason
// rather than accepted and ignored.
void refuse_unsupported(const RunOptions& o) {
  if (o.virtual_local_rank)
    throw ConfigError("--virtual-local-rank is not supported: it gives every rank LOCAL_RANK=0, and lockstep's ranks "
                      "place themselves by it (cores, shared memory); give each rank its GPU with LOCAL_RANK instead");
  if (!o.numa_binding.empty())
    throw ConfigError("--numa-binding is not supported: lockstep does not read the GPUs' NUMA placement; ranks pin "
                      "themselves to cores with lockstep::pin_to_core_of_local_rank, or run the launcher under numactl");
  if (!o.logs_specs.empty())
    throw ConfigError("--logs-specs names a Python plug-in of torchrun's; lockstep's log layout is fixed (--log-dir, "
                      "docs/launcher.md)");
  if (!o.event_log_handler.empty())
    throw ConfigError("--event-log-handler names a Python plug-in of torchrun's; lockstep's launcher logs to stderr");
}

}  // namespace

JobPlan plan_job(const RunOptions& o) {
  JobPlan plan;
  if (o.max_replacements > 0 && o.on_rank_failure != "continue")
    throw ConfigError(fmt::format("--max-replacements {} starts a new process for a rank that died while the others go "
                                  "on; add --on-rank-failure continue (under restart, --max-restarts starts every "
                                  "rank again instead)",
                                  o.max_replacements));
  plan.nodes = parse_nnodes(o.nnodes);
  const std::string& backend = o.rdzv_backend;
  // etcd-v2 is torchrun's other name for its etcd rendezvous.
  plan.etcd = backend == "etcd" || backend == "etcd-v2";
  if (!backend.empty() && backend != "static" && backend != "c10d" && !plan.etcd)
    throw ConfigError(fmt::format("--rdzv-backend '{}' is not known; use static, c10d or etcd", backend));
#if !LOCKSTEP_WITH_ETCD
  if (plan.etcd)
    throw ConfigError("--rdzv-backend etcd: this lockstep was built without libcurl, which it speaks to etcd with; "
                      "install libcurl4-openssl-dev and build again, or use --rdzv-backend c10d");
#endif
  plan.elastic = plan.nodes.elastic() || backend == "c10d" || plan.etcd;
  if (plan.nodes.elastic() && o.rdzv_backend == "static")
    throw ConfigError(fmt::format("--nnodes {} needs the c10d rendezvous; drop --rdzv-backend static", o.nnodes));
  if (plan.elastic && o.node_rank >= 0)
    throw ConfigError("in an elastic job the rendezvous numbers the nodes; drop --node-rank");
  plan.node_rank = std::max(0, o.node_rank);
  if (!plan.elastic && plan.node_rank >= plan.nodes.min)
    throw ConfigError(fmt::format("--node-rank {} is not below --nnodes {}", plan.node_rank, plan.nodes.min));
  const bool several = plan.elastic || plan.nodes.max > 1;
  if (o.standalone && several) throw ConfigError("--standalone is for a single node; drop it or --nnodes");
  plan.store_host = o.master_addr;
  plan.store_port = o.master_port;
  const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);
  if (plan.etcd) {
    if (o.rdzv_endpoint.empty())
      throw ConfigError("--rdzv-backend etcd needs --rdzv-endpoint: the etcd cluster's members, "
                        "host:2379[,host:2379...]");
    if (o.run_id.empty())
      throw ConfigError("--rdzv-backend etcd needs --rdzv-id: it names the job's keys in etcd, and every node must "
                        "give the same one");
  } else if (conf.names_etcd_keys()) {
    throw ConfigError("--rdzv-conf protocol, cacert, cert, key and username are for --rdzv-backend etcd");
  } else if (!o.rdzv_endpoint.empty()) {
    const Endpoint e = parse_endpoint(o.rdzv_endpoint);
    plan.store_host = e.host;
    plan.store_port = e.port > 0 ? e.port : 29400;  // torchrun's default
  }
  if (several && !plan.etcd && plan.store_port == 0)
    throw ConfigError("several nodes need a fixed --master-port or --rdzv-endpoint host:port (the same on every node)");
  const double join = conf.join_timeout >= 0 ? conf.join_timeout : o.rendezvous_seconds;
  const double last_call = conf.last_call_timeout >= 0 ? conf.last_call_timeout : o.last_call_seconds;
  plan.join_timeout = Duration(static_cast<std::int64_t>(join * 1000));
  plan.last_call = Duration(static_cast<std::int64_t>(last_call * 1000));
  if ((!o.tee.empty() || !o.redirects.empty()) && o.log_dir.empty())
    throw ConfigError("--tee and --redirects write each rank's streams to files under --log-dir; add --log-dir DIR");
  if ((!o.duplicate_stdout_filters.empty() || !o.duplicate_stderr_filters.empty()) && o.log_dir.empty())
    throw ConfigError("--duplicate-stdout-filters and --duplicate-stderr-filters write files under --log-dir; add "
                      "--log-dir DIR");
  refuse_unsupported(o);
  parse_local_ranks(o.local_ranks_filter);  // checks the values now, before any rank starts
  parse_signals(o.signals_to_handle);
  stream_mask(o.tee, 0, "--tee");
  stream_mask(o.redirects, 0, "--redirects");
  return plan;
}

}  // namespace lockstep::cli
