// Launcher environment resolution; see launch_env.h.
#include "comm/launch_env.h"

#include <fmt/format.h>

#include <climits>
#include <cstdio>
#include <optional>

#include "common/env.h"
#include "common/env_vars.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr Duration kDefaultConnectTimeout = std::chrono::seconds(60);
// The largest world lockstep accepts: far beyond any cluster, yet small
// enough that per-rank tables and rank arithmetic can never overflow an int.
constexpr std::int64_t kMaxWorldSize = 1 << 20;
constexpr std::int64_t kMaxPort = 65535;

// Launcher variables that count or number ranks, range-checked as 64-bit
// values before they are narrowed to int (WORLD_SIZE=4294967297 is not 1).
std::optional<int> env_rank(const char* name) {
  const auto v = env_int(name, 0, kMaxWorldSize - 1);
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}
std::optional<int> env_world_size(const char* name) {
  const auto v = env_int(name, 1, kMaxWorldSize);
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}

struct RankSource {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // may be null
};

constexpr RankSource kSources[] = {
    {"RANK/WORLD_SIZE", env::kRank, env::kWorldSize, env::kLocalRank, env::kLocalWorldSize},
    {"Open MPI", env::kOmpiRank, env::kOmpiSize, env::kOmpiLocalRank, env::kOmpiLocalSize},
    {"Slurm", env::kSlurmProcId, env::kSlurmNtasks, env::kSlurmLocalId, nullptr},
};

// A timeout of 0 would fail every collective at once; one past a week is a
// mistake, and one near Duration's limit overflows when added to now.
void check_timeout_option(const char* name, Duration value) {
  if (value <= Duration(0) || value > kMaxTimeout)
    throw InvalidArgument(fmt::format("GroupOptions::{} is {} ms; it must be from 1 ms to {} ms (a week), or unset "
                                      "to take it from the environment",
                                      name, value.count(), kMaxTimeout.count()));
}

void check_rank(int rank, int size, const std::string& how) {
  if (size < 1 || size > kMaxWorldSize)
    throw ConfigError(fmt::format("world size is {} ({}); it must be from 1 to {}", size, how, kMaxWorldSize));
  if (rank < 0 || rank >= size)
    throw ConfigError(fmt::format("rank {} is outside the world of {} ranks ({}); ranks are numbered 0..{}", rank,
                                  size, how, size - 1));
}

// Fills rank, world and local sizes from the first launcher whose variables
// are present. Returns false if none is.
bool from_launcher(LaunchInfo& info) {
  for (const auto& src : kSources) {
    const auto rank = env_rank(src.rank);
    const auto size = env_world_size(src.size);
    if (!rank && !size) continue;
    if (!rank || !size)
      throw ConfigError(fmt::format("{} is set but {} is not; set both (or start the program with `lockstep run`)",
                                    rank ? src.rank : src.size, rank ? src.size : src.rank));
    info.rank = static_cast<int>(*rank);
    info.world_size = static_cast<int>(*size);
    check_rank(info.rank, info.world_size, fmt::format("{}={}, {}={}", src.rank, *rank, src.size, *size));
    info.local_rank = env_rank(src.local_rank).value_or(info.rank);
    if (src.local_size != nullptr) {
      info.local_world_size = env_world_size(src.local_size).value_or(info.world_size);
    } else {
      const auto tasks = env_string(env::kSlurmTasksPerNode);
      const auto node = env_rank(env::kSlurmNodeId);
      info.local_world_size = tasks && node ? slurm_tasks_on_node(*tasks, *node) : info.world_size;
    }
    info.source = src.name;
    return true;
  }
  return false;
}

}  // namespace

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // Comma-separated entries "N" or "N(xK)" (N tasks on each of K nodes).
  int index = 0;
  std::size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    std::size_t end = tasks_per_node.find(',', pos);
    if (end == std::string::npos) end = tasks_per_node.size();
    const std::string entry = tasks_per_node.substr(pos, end - pos);
    int tasks = 0, repeat = 1;
    if (std::sscanf(entry.c_str(), "%d(x%d)", &tasks, &repeat) < 1)
      throw ConfigError(fmt::format("{}='{}' is not a Slurm task list", env::kSlurmTasksPerNode, tasks_per_node));
    if (node < index + repeat) return tasks;
    index += repeat;
    pos = end + 1;
  }
  throw ConfigError(fmt::format("{}='{}' lists no node {}", env::kSlurmTasksPerNode, tasks_per_node, node));
}

LaunchInfo resolve_launch(const GroupOptions& options) {
  LaunchInfo info;
  if (options.rank >= 0 || options.world_size >= 0) {
    if (options.rank < 0 || options.world_size < 0)
      throw ConfigError("GroupOptions: set both rank and world_size, or neither (to take them from the environment)");
    info.rank = options.rank;
    info.world_size = options.world_size;
    check_rank(info.rank, info.world_size, "GroupOptions");
    info.local_rank = env_rank(env::kLocalRank).value_or(info.rank);
    info.local_world_size = env_world_size(env::kLocalWorldSize).value_or(info.world_size);
    info.source = "options";
  } else if (!from_launcher(info)) {
    info.source = "none";
  }

  info.master_addr = !options.master_addr.empty() ? options.master_addr : env_string(env::kMasterAddr).value_or("");
  if (options.master_port >= 0) {
    info.master_port = options.master_port;
  } else if (auto port = env_int(env::kMasterPort, 1, kMaxPort)) {
    info.master_port = static_cast<int>(*port);
  }
  if (info.master_port > 65535 || (info.master_port <= 0 && info.master_port != -1))
    throw ConfigError(fmt::format("MASTER_PORT={} is not a TCP port; use a free port in 1..65535", info.master_port));

  // Under mpirun the store can be found without MASTER_ADDR: rank 0 hosts it
  // and shares its address through MPI (init.cc, comm/mpi/bootstrap.h).
  const bool mpi_bootstrap = info.source == "Open MPI" && info.master_addr.empty();
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

  info.store_hosted = env_flag(env::kStoreHosted).value_or(false);
  info.token = env_string(env::kStoreToken).value_or("");
  const std::string run = env_string(env::kRunId).value_or(env_string(env::kTorchelasticRunId).value_or("job"));
  const auto restart = env_int(env::kRestartCount, 0, INT_MAX)
                           .value_or(env_int(env::kTorchelasticRestartCount, 0, INT_MAX).value_or(0));
  info.run_id = fmt::format("{}/{}", run, restart);
  if (options.timeout) check_timeout_option("timeout", *options.timeout);
  if (options.connect_timeout) check_timeout_option("connect_timeout", *options.connect_timeout);
  info.timeout = options.timeout.value_or(env_seconds(env::kTimeout).value_or(Store::kDefaultTimeout));
  info.connect_timeout =
      options.connect_timeout.value_or(env_seconds(env::kConnectTimeout).value_or(kDefaultConnectTimeout));
  return info;
}

}  // namespace lockstep
