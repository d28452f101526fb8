// See slurm_defaults.h.
#include "run/slurm_defaults.h"

#include <fmt/format.h>

#include <cstdint>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/slurm.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

constexpr char kStepNumNodes[] = "SLURM_STEP_NUM_NODES";
constexpr char kStepNumTasks[] = "SLURM_STEP_NUM_TASKS";
constexpr char kStepId[] = "SLURM_STEP_ID";

bool shape_given(const RunOptions& o) {
  const RunOptions defaults;
  return o.nnodes != defaults.nnodes || o.node_rank >= 0 || o.master_addr != defaults.master_addr ||
         o.master_port != defaults.master_port || !o.rdzv_endpoint.empty();
}

}  // namespace

RunOptions with_slurm_defaults(RunOptions o, const Config::Lookup& lookup, std::string* note) {
  const VariableReader vars(lookup);
  const auto nodes = vars.integer(kStepNumNodes, 1, 1 << 20);
  const auto node = vars.integer(env::kSlurmNodeId, 0, 1 << 20);
  if (!nodes || !node || *nodes == 1 || shape_given(o)) return o;
  const auto tasks = vars.integer(kStepNumTasks, 1, 1 << 30);
  if (tasks && *tasks != *nodes)
    throw ConfigError(fmt::format(
        "srun started {} tasks on {} nodes ({}={}, {}={}), so several `lockstep run` launchers share a node: start "
        "one per node (srun --ntasks-per-node=1 lockstep run --nproc-per-node N ...), or let srun start the ranks "
        "themselves without `lockstep run`",
        *tasks, *nodes, kStepNumTasks, *tasks, kStepNumNodes, *nodes));
  const char* list_name = vars.string(env::kSlurmStepNodeList) ? env::kSlurmStepNodeList : env::kSlurmJobNodeList;
  const auto list = vars.string(list_name);
  const auto job = vars.integer(env::kSlurmJobId, 0, INT64_MAX);
  if (!list || !job)
    throw ConfigError(fmt::format("srun started this launcher on node {} of {}, but {} or {} is missing; give "
                                  "--nnodes, --node-rank and --rdzv-endpoint",
                                  *node, *nodes, env::kSlurmStepNodeList, env::kSlurmJobId));
  o.nnodes = std::to_string(*nodes);
  o.node_rank = static_cast<int>(*node);
  o.master_addr = slurm_first_host(*list, list_name);
  o.master_port = slurm_store_port(*job);
  if (o.run_id.empty()) o.run_id = fmt::format("slurm-{}.{}", *job, vars.string(kStepId).value_or("0"));
  *note = fmt::format("from Slurm: node {} of {}, store on {}:{} (the first node of {}={})", o.node_rank, *nodes,
                      o.master_addr, o.master_port, list_name, *list);
  return o;
}

}  // namespace lockstep::cli
