// Launcher environment resolution; see launch_env.h.
#include "comm/launch_env.h"

#include <fmt/format.h>

#include <optional>

#include "common/env.h"
#include "common/env_vars.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr Duration kDefaultConnectTimeout = std::chrono::seconds(60);
// The largest world lockstep accepts: far beyond any cluster, yet small
// enough that per-rank tables and rank arithmetic can never overflow an int.
constexpr int kMaxWorldSize = 1 << 20;

// A timeout of 0 would fail every collective at once; one past a week is a
// mistake, and one near Duration's limit overflows when added to now.
void check_timeout(const char* what, const std::optional<Duration>& value) {
  if (value && (*value <= Duration(0) || *value > kMaxTimeout))
    throw InvalidArgument(fmt::format("{} is {} ms; it must be from 1 ms to {} ms (a week), or unset to take it "
                                      "from the environment",
                                      what, value->count(), kMaxTimeout.count()));
}

void check_rank(int rank, int size, const std::string& how) {
  if (size < 1 || size > kMaxWorldSize)
    throw ConfigError(fmt::format("world size is {} ({}); it must be from 1 to {}", size, how, kMaxWorldSize));
  if (rank < 0 || rank >= size)
    throw ConfigError(fmt::format("rank {} is outside the world of {} ranks ({}); ranks are numbered 0..{}", rank,
                                  size, how, size - 1));
}

// The place on its host of a rank the program numbered itself: LOCAL_RANK
// and LOCAL_WORLD_SIZE where they fit its world, else the whole world on
// one host. The program's numbers win over the launcher's variables, which
// describe the job's world and not, say, a subgroup's; variables that
// contradict themselves are named in ignored_variables, never fatal.
void place_on_host(const Config& config, LaunchInfo& info) {
  info.local_rank = info.rank;
  info.local_world_size = info.world_size;
  if (!config.launcher_problem.empty()) {
    info.ignored_variables = config.launcher_problem;
    return;
  }
  const int local_size = config.local_world_size.value_or(info.world_size);
  const int local_rank = config.local_rank.value_or(info.rank);
  if (local_size > info.world_size || local_rank >= local_size) return;  // another group's numbers
  info.local_rank = local_rank;
  info.local_world_size = local_size;
}

}  // namespace

LaunchInfo resolve_launch(const GroupOptions& options, const Config& config) {
  LaunchInfo info;
  if (options.rank >= 0 || options.world_size >= 0) {
    if (options.rank < 0 || options.world_size < 0)
      throw ConfigError("GroupOptions: set both rank and world_size, or neither (to take them from the environment)");
    info.rank = options.rank;
    info.world_size = options.world_size;
    check_rank(info.rank, info.world_size, "GroupOptions");
    place_on_host(config, info);
    info.source = LaunchSource::options;
  } else {
    const LauncherPlacement& p = config.placement();
    if (p.source != LaunchSource::none)
      check_rank(p.rank, p.world_size, fmt::format("from {}", to_string(p.source)));
    info.rank = p.rank;
    info.world_size = p.world_size;
    info.local_rank = p.local_rank;
    info.local_world_size = p.local_world_size;
    info.source = p.source;
  }

  // The store: a launcher's (LOCKSTEP_STORE_*) unless the program names one;
  // else MASTER_ADDR/PORT, where rank 0 hosts it.
  const bool launcher_store = config.store_hosted && options.master_addr.empty() && options.master_port < 0;
  info.master_addr = !options.master_addr.empty() ? options.master_addr
                     : launcher_store              ? config.store_addr
                                                   : config.master_addr;
  info.master_port = options.master_port >= 0 ? options.master_port
                     : launcher_store          ? config.store_port.value_or(-1)
                                               : config.master_port.value_or(-1);
  if (info.master_port > 65535 || (info.master_port <= 0 && info.master_port != -1))
    throw ConfigError(fmt::format("MASTER_PORT={} is not a TCP port; use a free port in 1..65535", info.master_port));

  // Under mpirun the store can be found without MASTER_ADDR: rank 0 hosts it
  // and shares its address through MPI (init.cc, comm/mpi/bootstrap.h).
  const bool mpi_bootstrap = info.source == LaunchSource::open_mpi && info.master_addr.empty();
  if (!options.store && info.world_size > 1 && !mpi_bootstrap) {
    if (info.master_addr.empty())
      throw ConfigError(fmt::format(
          "MASTER_ADDR is not set, so rank {} of {} cannot find the others. Set MASTER_ADDR to the host of rank 0 "
          "and MASTER_PORT to a free port on it, or start the program with `lockstep run`, which sets both",
          info.rank, info.world_size));
    if (info.master_port < 0)
      throw ConfigError(fmt::format("MASTER_PORT is not set; set it to a free port on {} (MASTER_ADDR), e.g. 29500",
                                    info.master_addr));
  }

  // Under srun, the others look for rank 0's store on the step's first
  // node: say so at once if Slurm put task 0 elsewhere (a distribution
  // other than block or cyclic), rather than let them time out.
  if (info.rank == 0 && info.world_size > 1 && !launcher_store && options.master_addr.empty() &&
      !config.master_addr_from.empty() && !config.slurm_node_name.empty() &&
      config.slurm_node_name != config.master_addr)
    throw ConfigError(fmt::format(
        "rank 0 runs on {} ({}), but the other tasks look for its store on {} ({}): start the step with srun's "
        "default distribution, or set MASTER_ADDR to the host of task 0 for every task",
        config.slurm_node_name, env::kSlurmdNodeName, config.master_addr, config.master_addr_from));

  info.store_hosted = launcher_store;
  info.token = config.store_token;
  info.run_id = fmt::format("{}/{}", config.run_name, config.restart_count);
  check_timeout("GroupOptions::timeout", options.timeout);
  check_timeout("GroupOptions::connect_timeout", options.connect_timeout);
  check_timeout("Config::timeout", config.timeout);
  check_timeout("Config::connect_timeout", config.connect_timeout);
  info.timeout = options.timeout.value_or(config.timeout.value_or(Store::kDefaultTimeout));
  info.connect_timeout = options.connect_timeout.value_or(config.connect_timeout.value_or(kDefaultConnectTimeout));
  info.mpi_abort_on_failure = config.mpi_abort_on_failure;
  return info;
}

}  // namespace lockstep
