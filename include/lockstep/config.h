// Every setting lockstep takes from the environment, parsed and checked once
// into one value. The front ends (init_process_group, the torch DDP wrapper
// through its group, the `lockstep` tools) make it with
// Config::from_environment(), or take one given explicitly
// (GroupOptions::config); everything below them reads this value, never the
// environment. Each variable is documented in docs/env.md.
//
//   lockstep::Config config;                  // defaults, environment ignored
//   config.timeout = std::chrono::seconds(30);
//   lockstep::GroupOptions options;
//   options.config = config;
//   auto pg = lockstep::init_process_group(options);
//
// A plain value; thread-safe to share once built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/types.h"

namespace lockstep {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

// Which launcher's variables gave this process its rank and world size.
enum class LaunchSource {
  none,      // none found: a world of one
  options,   // GroupOptions::rank / world_size
  torchrun,  // RANK / WORLD_SIZE (lockstep run, torchrun)
  open_mpi,  // OMPI_COMM_WORLD_* (mpirun)
  slurm,     // SLURM_* (srun)
};
// "none", "options", "RANK/WORLD_SIZE", "Open MPI", "Slurm".
std::string_view to_string(LaunchSource source);

// LOCKSTEP_DEBUG: extra checks that cost time.
enum class DebugLevel { off, info, detail };
// How the shm backend writes the slots its peers read (src/comm/shm/handoff_copy.h):
// with streaming stores while its peers are measured to be far (automatic),
// always, or never.
enum class ShmStreamingStores { automatic, always, never };
// How the shm backend moves ordinary buffers (the caller's memory) in large
// all-reduces and broadcasts: through its shared slots, by single copy
// (cross-memory attach: peers read and write each other's buffers), or,
// automatic, the way each measures cheaper (src/comm/shm/ordinary_paths.h).
enum class ShmOrdinaryPath { automatic, slots, single_copy };

// The rank placement one launcher's variables give.
struct LauncherPlacement {
  LaunchSource source = LaunchSource::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};

struct Config {
  // Found by looking at RANK/WORLD_SIZE, then OMPI_COMM_WORLD_*, then SLURM_*.
  // Read it through placement(), which refuses variables that contradict
  // themselves.
  LauncherPlacement launcher;
  // LOCAL_RANK / LOCAL_WORLD_SIZE, for a rank given in GroupOptions.
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  // What is wrong with the launcher's variables (half a RANK/WORLD_SIZE
  // pair, a rank outside its world, a local rank outside its host, a value
  // that is not a number), as the ConfigError it becomes; empty: nothing.
  // Kept rather than thrown: it matters only to a group that takes its
  // place from those variables. A group whose rank and size the program
  // gives (torch.distributed hands them to a backend, with the launcher's
  // WORLD_SIZE still set) ignores them; launcher, local_rank and
  // local_world_size are then unset.
  std::string launcher_problem;
  // OMPI_COMM_WORLD_SIZE is set: this process was started by mpirun.
  bool started_by_mpirun = false;

  // Rendezvous (MASTER_ADDR, MASTER_PORT, LOCKSTEP_STORE_*). Under srun
  // without them: the first node of the step's node list and a port from
  // the job's id (common/slurm.h); master_addr_from and master_port_from
  // then say so ("SLURM_STEP_NODELIST=node[1-4]"), for messages.
  std::string master_addr;  // empty: none
  std::optional<int> master_port;
  std::string master_addr_from;
  std::string master_port_from;
  // SLURMD_NODENAME: the node Slurm started this task on.
  std::string slurm_node_name;
  // LOCKSTEP_STORE_ADDR/PORT: a launcher already runs the store server
  // there, so rank 0 must not host one (and MASTER_* are the program's).
  bool store_hosted = false;
  std::string store_addr;
  std::optional<int> store_port;
  std::string store_token;
  // LOCKSTEP_RUN_ID, else TORCHELASTIC_RUN_ID, else "job"; and the restart
  // (LOCKSTEP_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT, else 0).
  std::string run_name = "job";
  int restart_count = 0;
  // LOCKSTEP_ON_RANK_FAILURE, set by `lockstep run`: "restart" (it stops
  // every rank when one dies, so a group must not re-form in place) or
  // "continue" (ProcessGroup::shrink); empty when no launcher said.
  std::string on_rank_failure;
  // LOCKSTEP_INCARNATION, set by `lockstep run --max-replacements`: 0 for a
  // rank's first start in the round; a replacement (1, 2, ...) joins the
  // group its peers are running (init_process_group, docs/faults.md).
  int incarnation = 0;
  // LOCKSTEP_MAX_REPLACEMENTS, set by `lockstep run --on-rank-failure
  // continue --max-replacements N`: how many replacements each launcher
  // starts (0: none, or no launcher said).
  int max_replacements = 0;
  std::string torchelastic_run_id;  // TORCHELASTIC_RUN_ID
  // TORCHELASTIC_USE_AGENT_STORE (torchrun sets "True" or "False"): torchrun's
  // agent hosts a PyTorch TCPStore at MASTER_ADDR:MASTER_PORT, so every rank
  // joins it as a client instead of rank 0 hosting lockstep's store.
  bool torchelastic_use_agent_store = false;

  // Group.
  std::string backend = "auto";
  std::optional<Duration> timeout;          // null: Store::kDefaultTimeout
  std::optional<Duration> connect_timeout;  // null: 60 s
  LogLevel log_level = LogLevel::warn;

  // Backends.
  std::string socket_addr;                     // tcp: empty chooses
  std::string host_id;                         // pretend host (hier tests); empty: hostname + boot id
  std::optional<std::size_t> tcp_small_bytes;  // tcp: null measures
  std::optional<std::size_t> shm_one_shot_bytes;
  std::optional<std::size_t> shm_chunk_bytes;
  std::optional<std::int64_t> shm_spin_micros;
  std::string shm_tag;  // set by `lockstep run`; empty: none
  std::optional<std::size_t> shm_single_copy_bytes;
  ShmStreamingStores shm_streaming_stores = ShmStreamingStores::automatic;
  ShmOrdinaryPath shm_ordinary_path = ShmOrdinaryPath::automatic;
  std::optional<std::size_t> mpi_max_count;  // null: INT_MAX
  bool mpi_abort_on_failure = true;
  // CUDA memory over shm, tcp, hier and mpi: the bytes of each chunk staged
  // through pinned host memory (null: 4 MiB). Every rank must use the same.
  std::optional<std::size_t> cuda_staging_chunk_bytes;

  // Diagnostics.
  DebugLevel debug = DebugLevel::off;
  std::string trace_prefix;  // LOCKSTEP_TRACE; empty: no timeline
  std::string stats_prefix;  // LOCKSTEP_STATS; empty: no statistics file
  std::string flight_dir;    // LOCKSTEP_FLIGHT_DIR; empty: the temporary directory
  std::optional<Duration> watchdog_settle;
  std::optional<Duration> stall_warning;

  // A variable's value, or null when it is unset (or empty).
  using Lookup = std::function<std::optional<std::string>(const char* name)>;

  // Reads and checks every variable through `lookup`. A bad value is a
  // ConfigError naming the variable, the value and what is accepted.
  static Config parse(const Lookup& lookup);
  // parse() over this process's environment.
  static Config from_environment();

  // The launcher's placement of this process; ConfigError(launcher_problem)
  // when its variables contradict themselves.
  const LauncherPlacement& placement() const;
};

}  // namespace lockstep
