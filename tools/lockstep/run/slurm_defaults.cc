// See slurm_defaults.h.
#include "run/slurm_defaults.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/slurm.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

bool shape_given(const RunOptions& o) {
  const RunOptions defaults;
  return o.nnodes != defaults.nnodes || o.node_rank >= 0 || o.master_addr != defaults.master_addr ||
         o.master_port != defaults.master_port || !o.rdzv_endpoint.empty();
}

}  // namespace

RunOptions with_slurm_defaults(RunOptions o, const Config::Lookup& lookup, std::string* note) {
  const VariableReader vars(lookup);
  const auto nodes = vars.integer(env::kSlurmStepNumNodes, 1, 1 << 20);
  const auto node = vars.integer(env::kSlurmNodeId, 0, 1 << 20);
  if (!nodes || !node || *nodes == 1 || shape_given(o)) return o;
  const auto tasks = vars.integer(env::kSlurmStepNumTasks, 1, 1 << 30);
  if (tasks && *tasks != *nodes)
    throw ConfigError(fmt::format(
        "srun started {} tasks on {} nodes ({}={}, {}={}), so several `lockstep run` launchers share a node: start "
        "one per node (srun --ntasks-per-node=1 lockstep run --nproc-per-node N ...), or let srun start the ranks "
        "themselves without `lockstep run`",
        *tasks, *nodes, env::kSlurmStepNumTasks, *tasks, env::kSlurmStepNumNodes, *nodes));
  const SlurmStore store = slurm_store(vars);
  if (store.host.empty() || !store.port)
    throw ConfigError(fmt::format("srun started this launcher on node {} of {}, but {} or {} is missing; give "
                                  "--nnodes, --node-rank and --rdzv-endpoint",
                                  *node, *nodes, env::kSlurmStepNodeList, env::kSlurmJobId));
  o.nnodes = std::to_string(*nodes);
  o.node_rank = static_cast<int>(*node);
  o.master_addr = store.host;
  o.master_port = *store.port;
  if (o.run_id.empty())
    o.run_id = fmt::format("slurm-{}.{}", *store.job_id, vars.string(env::kSlurmStepId).value_or("0"));
  *note = fmt::format("from Slurm: node {} of {}, store on {}:{} ({})", o.node_rank, *nodes, o.master_addr,
                      o.master_port, store.host_from);
  return o;
}

}  // namespace lockstep::cli
