// Config::parse: every variable read and checked once. Stateless;
// thread-safe (see lockstep/config.h).
#include "lockstep/config.h"

#include <fmt/format.h>

#include <cctype>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/slurm.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

// The largest world lockstep accepts: far beyond any cluster, yet small
// enough that per-rank tables and rank arithmetic can never overflow an int.
constexpr std::int64_t kMaxWorldSize = 1 << 20;
constexpr std::int64_t kMaxPort = 65535;
// Message sizes (tcp crossover, shm slots): anything above a GiB is a typo.
constexpr std::int64_t kMaxMessageBytes = std::int64_t{1} << 30;

// Launcher variables that count or number ranks, range-checked as 64-bit
// values before they are narrowed to int (WORLD_SIZE=4294967297 is not 1).
std::optional<int> read_rank(const VariableReader& vars, const char* name) {
  const auto v = vars.integer(name, 0, kMaxWorldSize - 1);
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}
std::optional<int> read_world_size(const VariableReader& vars, const char* name) {
  const auto v = vars.integer(name, 1, kMaxWorldSize);
  return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
}
std::optional<std::size_t> read_bytes(const VariableReader& vars, const char* name, std::int64_t max) {
  const auto v = vars.integer(name, 0, max);
  return v ? std::optional<std::size_t>(static_cast<std::size_t>(*v)) : std::nullopt;
}

// A launcher variable as it was set, for messages: LOCAL_WORLD_SIZE=1.
struct Setting {
  std::string name;
  int value = 0;
  std::string text;  // "NAME=value", or how a derived value came about
};
std::optional<Setting> setting(const char* name, std::optional<int> value) {
  if (!value) return std::nullopt;
  return Setting{name, *value, fmt::format("{}={}", name, *value)};
}

// Refuses a place on the host that contradicts itself or the world:
// LOCAL_RANK=5 with LOCAL_WORLD_SIZE=1 used to be taken as it was, and
// used to pin the rank to a core or choose its GPU. Only values that were
// set are compared; a default (the local rank is the rank) cannot
// contradict them.
void check_local_placement(const std::optional<Setting>& local_rank, const std::optional<Setting>& local_size,
                           const std::optional<Setting>& world_size) {
  if (local_size && world_size && local_size->value > world_size->value)
    throw ConfigError(fmt::format("{} is larger than {}: a host cannot run more ranks than the whole job; set {} to "
                                  "the number of ranks on this host",
                                  local_size->text, world_size->text, local_size->name));
  if (!local_rank) return;
  const std::string_view launcher = local_rank->name == env::kLocalRank ? " (`lockstep run` and torchrun set both)" : "";
  if (local_size && local_rank->value >= local_size->value)
    throw ConfigError(fmt::format("{} is not below {}: the ranks on a host are numbered 0..{}; set {} to this "
                                  "process's index on its host and {} to the number of ranks there{}",
                                  local_rank->text, local_size->text, local_size->value - 1, local_rank->name,
                                  local_size->name, launcher));
  if (!local_size && world_size && local_rank->value >= world_size->value)
    throw ConfigError(fmt::format("{} is not below {}: no host has more ranks than the whole job; set {} to this "
                                  "process's index on its host{}",
                                  local_rank->text, world_size->text, local_rank->name, launcher));
}

struct RankSource {
  LaunchSource source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // may be null
};

constexpr RankSource kSources[] = {
    {LaunchSource::torchrun, env::kRank, env::kWorldSize, env::kLocalRank, env::kLocalWorldSize},
    {LaunchSource::open_mpi, env::kOmpiRank, env::kOmpiSize, env::kOmpiLocalRank, env::kOmpiLocalSize},
    {LaunchSource::slurm, env::kSlurmProcId, env::kSlurmNtasks, env::kSlurmLocalId, nullptr},
};

// The first launcher whose variables are present; source none if none is.
LauncherPlacement read_launcher(const VariableReader& vars) {
  LauncherPlacement p;
  for (const auto& src : kSources) {
    const auto rank = read_rank(vars, src.rank);
    const auto size = read_world_size(vars, src.size);
    if (!rank && !size) continue;
    if (!rank || !size)
      throw ConfigError(fmt::format("{} is set but {} is not; set both (or start the program with `lockstep run`)",
                                    rank ? src.rank : src.size, rank ? src.size : src.rank));
    if (*rank >= *size)
      throw ConfigError(fmt::format("rank {} is outside the world of {} ranks ({}={}, {}={}); ranks are numbered 0..{}",
                                    *rank, *size, src.rank, *rank, src.size, *size, *size - 1));
    p.source = src.source;
    p.rank = *rank;
    p.world_size = *size;
    const auto local_rank = setting(src.local_rank, read_rank(vars, src.local_rank));
    std::optional<Setting> local_size;
    if (src.local_size != nullptr) {
      local_size = setting(src.local_size, read_world_size(vars, src.local_size));
    } else {
      const auto tasks = vars.string(env::kSlurmTasksPerNode);
      const auto node = read_rank(vars, env::kSlurmNodeId);
      if (tasks && node) {
        const int n = slurm_tasks_on_node(*tasks, *node);
        local_size = Setting{env::kSlurmTasksPerNode, n,
                             fmt::format("{}={} ({} on node {}={})", env::kSlurmTasksPerNode, *tasks, n,
                                         env::kSlurmNodeId, *node)};
      }
    }
    check_local_placement(local_rank, local_size, setting(src.size, *size));
    p.local_rank = local_rank ? local_rank->value : p.rank;
    p.local_world_size = local_size ? local_size->value : p.world_size;
    return p;
  }
  return p;
}

LogLevel read_log_level(const VariableReader& vars) {
  const auto text = vars.string(env::kLogLevel);
  if (!text) return LogLevel::warn;
  constexpr std::pair<const char*, LogLevel> kNames[] = {{"error", LogLevel::error}, {"warn", LogLevel::warn},
                                                         {"warning", LogLevel::warn}, {"info", LogLevel::info},
                                                         {"debug", LogLevel::debug}, {"trace", LogLevel::trace}};
  std::string lower = *text;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [name, level] : kNames)
    if (lower == name) return level;
  throw ConfigError(fmt::format("{}='{}' is not a log level; use error, warn, info, debug or trace", env::kLogLevel,
                                *text));
}

DebugLevel read_debug(const VariableReader& vars) {
  const std::string text = vars.string(env::kDebug).value_or("OFF");
  if (text == "OFF" || text == "off") return DebugLevel::off;
  if (text == "INFO" || text == "info") return DebugLevel::info;
  if (text == "DETAIL" || text == "detail") return DebugLevel::detail;
  throw ConfigError(fmt::format("{}='{}' is not a debug level; use OFF, INFO or DETAIL", env::kDebug, text));
}

// A variable of auto, always or never, into an enum with those three.
template <typename Choice>
Choice read_auto_always_never(const VariableReader& vars, const char* name) {
  const std::string text = vars.string(name).value_or("auto");
  if (text == "auto") return Choice::automatic;
  if (text == "always") return Choice::always;
  if (text == "never") return Choice::never;
  throw ConfigError(fmt::format("{}='{}' is not a choice; use auto, always or never", name, text));
}

ShmOrdinaryPath read_ordinary_path(const VariableReader& vars) {
  const std::string text = vars.string(env::kShmOrdinaryPath).value_or("auto");
  if (text == "auto") return ShmOrdinaryPath::automatic;
  if (text == "slots") return ShmOrdinaryPath::slots;
  if (text == "single-copy") return ShmOrdinaryPath::single_copy;
  throw ConfigError(fmt::format("{}='{}' is not a choice; use auto, slots or single-copy", env::kShmOrdinaryPath, text));
}

// The launcher's variables, and LOCAL_RANK / LOCAL_WORLD_SIZE (which also
// place a rank given in GroupOptions, where no launcher variables are
// read: so they are checked against each other here too). A contradiction
// is kept in launcher_problem, not thrown (see Config).
void read_placement(const VariableReader& vars, Config& c) {
  try {
    c.launcher = read_launcher(vars);
    c.local_rank = read_rank(vars, env::kLocalRank);
    c.local_world_size = read_world_size(vars, env::kLocalWorldSize);
    check_local_placement(setting(env::kLocalRank, c.local_rank), setting(env::kLocalWorldSize, c.local_world_size),
                          std::nullopt);
  } catch (const ConfigError& e) {
    c.launcher = {};
    c.local_rank.reset();
    c.local_world_size.reset();
    c.launcher_problem = e.what();
  }
}

// A task of srun finds the store where Slurm starts task 0, the first node
// of the step, on a port every task derives from the job's id: no variable
// to set by hand. MASTER_ADDR and MASTER_PORT still win.
void read_slurm_rendezvous(const VariableReader& vars, Config& c) {
  c.slurm_node_name = vars.string(env::kSlurmdNodeName).value_or("");
  const SlurmStore store = slurm_store(vars, /*with_host=*/c.master_addr.empty());
  if (c.master_addr.empty()) {
    c.master_addr = store.host;
    c.master_addr_from = store.host_from;
  }
  if (!c.master_port && store.port) {
    c.master_port = store.port;
    c.master_port_from = store.port_from;
  }
}

void read_rendezvous(const VariableReader& vars, Config& c) {
  c.started_by_mpirun = vars.string(env::kOmpiSize).has_value();
  c.master_addr = vars.string(env::kMasterAddr).value_or("");
  if (auto port = vars.integer(env::kMasterPort, 1, kMaxPort)) c.master_port = static_cast<int>(*port);
  if (c.launcher.source == LaunchSource::slurm) read_slurm_rendezvous(vars, c);
  c.store_addr = vars.string(env::kStoreAddr).value_or("");
  if (auto port = vars.integer(env::kStorePort, 1, kMaxPort)) c.store_port = static_cast<int>(*port);
  if (c.store_addr.empty() != !c.store_port)
    throw ConfigError(fmt::format("{} and {} go together (a launcher's store); set both or neither", env::kStoreAddr,
                                  env::kStorePort));
  c.store_hosted = !c.store_addr.empty();
  c.store_token = vars.string(env::kStoreToken).value_or("");
  c.torchelastic_run_id = vars.string(env::kTorchelasticRunId).value_or("");
  c.torchelastic_use_agent_store = vars.flag(env::kTorchelasticUseAgentStore).value_or(false);
  c.run_name = vars.string(env::kRunId).value_or(c.torchelastic_run_id.empty() ? "job" : c.torchelastic_run_id);
  const auto restart = vars.integer(env::kRestartCount, 0, INT_MAX);
  const auto elastic_restart = vars.integer(env::kTorchelasticRestartCount, 0, INT_MAX);
  c.restart_count = static_cast<int>(restart.value_or(elastic_restart.value_or(0)));
  c.on_rank_failure = vars.string(env::kOnRankFailure).value_or("");
  c.incarnation = static_cast<int>(vars.integer(env::kIncarnation, 0, INT_MAX).value_or(0));
  c.max_replacements = static_cast<int>(vars.integer(env::kMaxReplacements, 0, INT_MAX).value_or(0));
  if (!c.on_rank_failure.empty() && c.on_rank_failure != "restart" && c.on_rank_failure != "continue")
    throw ConfigError(fmt::format("{}='{}': use restart or continue (lockstep run --on-rank-failure sets it)",
                                  env::kOnRankFailure, c.on_rank_failure));
  if (c.incarnation > 0 && c.on_rank_failure != "continue")
    throw ConfigError(fmt::format("{}={} starts a replacement, which joins a group that goes on after a death; that "
                                  "needs {}=continue (lockstep run --on-rank-failure continue --max-replacements N "
                                  "sets both)",
                                  env::kIncarnation, c.incarnation, env::kOnRankFailure));
}

void read_backends(const VariableReader& vars, Config& c) {
  c.backend = vars.string(env::kBackend).value_or("auto");
  c.socket_addr = vars.string(env::kSocketAddr).value_or("");
  c.host_id = vars.string(env::kHostId).value_or("");
  c.tcp_small_bytes = read_bytes(vars, env::kTcpSmallBytes, kMaxMessageBytes);
  c.shm_one_shot_bytes = read_bytes(vars, env::kShmOneShotBytes, kMaxMessageBytes);
  c.shm_chunk_bytes = read_bytes(vars, env::kShmChunkBytes, kMaxMessageBytes);
  c.cuda_staging_chunk_bytes = read_bytes(vars, env::kCudaStagingChunkBytes, kMaxMessageBytes);
  // How long a wait spins before it sleeps: up to a second (past that, a
  // sleeping wait's 2 ms slices cost nothing).
  c.shm_spin_micros = vars.integer(env::kShmSpinMicros, 0, 1'000'000);
  c.shm_tag = vars.string(env::kShmTag).value_or("");
  c.shm_single_copy_bytes = read_bytes(vars, env::kShmSingleCopyBytes, std::int64_t{1} << 40);
  c.shm_streaming_stores = read_auto_always_never<ShmStreamingStores>(vars, env::kShmStreamingStores);
  c.shm_ordinary_path = read_ordinary_path(vars);
  if (auto v = vars.integer(env::kMpiMaxCount, 1, INT_MAX)) c.mpi_max_count = static_cast<std::size_t>(*v);
  c.mpi_abort_on_failure = vars.flag(env::kMpiAbortOnFailure).value_or(true);
}

void read_diagnostics(const VariableReader& vars, Config& c) {
  c.debug = read_debug(vars);
  c.trace_prefix = vars.string(env::kTrace).value_or("");
  c.stats_prefix = vars.string(env::kStats).value_or("");
  c.flight_dir = vars.string(env::kFlightDir).value_or("");
  c.watchdog_settle = vars.seconds(env::kWatchdogSettle);
  c.stall_warning = vars.seconds(env::kStallWarning);
}

}  // namespace

std::string_view to_string(LaunchSource source) {
  switch (source) {
    case LaunchSource::none: return "none";
    case LaunchSource::options: return "options";
    case LaunchSource::torchrun: return "RANK/WORLD_SIZE";
    case LaunchSource::open_mpi: return "Open MPI";
    case LaunchSource::slurm: return "Slurm";
  }
  return "?";
}

Config Config::parse(const Lookup& lookup) {
  // Empty values count as unset, whatever the lookup returns.
  const VariableReader vars([&lookup](const char* name) -> std::optional<std::string> {
    auto v = lookup(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  });
  Config c;
  read_placement(vars, c);
  read_rendezvous(vars, c);
  c.timeout = vars.seconds(env::kTimeout);
  c.connect_timeout = vars.seconds(env::kConnectTimeout);
  c.log_level = read_log_level(vars);
  read_backends(vars, c);
  read_diagnostics(vars, c);
  return c;
}

Config Config::from_environment() { return parse(environment_lookup); }

const LauncherPlacement& Config::placement() const {
  if (!launcher_problem.empty()) throw ConfigError(launcher_problem);
  return launcher;
}

}  // namespace lockstep
