// Every environment variable lockstep reads or sets, in one place. Each is
// documented in docs/env.md; add a variable here and there together.
// Constants only; thread-safe.
#pragma once

namespace lockstep::env {

// Set by torchrun and by `lockstep run`; read by init_process_group.
inline constexpr char kRank[] = "RANK";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kGroupRank[] = "GROUP_RANK";  // the node's rank
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kTorchelasticRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kTorchelasticRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
// Set by torchrun and by `lockstep run` for the program; lockstep reads none of them.
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kTorchelasticMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kTorchelasticUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
// (Read all the same when torchrun set it: "True" makes every rank a client
// of the PyTorch TCPStore torchrun's agent hosts; docs/torchrun.md.)
inline constexpr char kTorchelasticErrorFile[] = "TORCHELASTIC_ERROR_FILE";  // lockstep::record_error() writes it

// Set by Open MPI's mpirun.
inline constexpr char kOmpiRank[] = "OMPI_COMM_WORLD_RANK";
inline constexpr char kOmpiSize[] = "OMPI_COMM_WORLD_SIZE";
inline constexpr char kOmpiLocalRank[] = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr char kOmpiLocalSize[] = "OMPI_COMM_WORLD_LOCAL_SIZE";

// Set by Slurm's srun.
inline constexpr char kSlurmProcId[] = "SLURM_PROCID";
inline constexpr char kSlurmNtasks[] = "SLURM_NTASKS";
inline constexpr char kSlurmLocalId[] = "SLURM_LOCALID";
inline constexpr char kSlurmNodeId[] = "SLURM_NODEID";
inline constexpr char kSlurmTasksPerNode[] = "SLURM_TASKS_PER_NODE";
inline constexpr char kSlurmJobId[] = "SLURM_JOB_ID";
// The step's nodes (srun), else the job's: task 0 runs on the first.
inline constexpr char kSlurmStepNodeList[] = "SLURM_STEP_NODELIST";
inline constexpr char kSlurmJobNodeList[] = "SLURM_JOB_NODELIST";
// The step srun started: its number, nodes and tasks.
inline constexpr char kSlurmStepId[] = "SLURM_STEP_ID";
inline constexpr char kSlurmStepNumNodes[] = "SLURM_STEP_NUM_NODES";
inline constexpr char kSlurmStepNumTasks[] = "SLURM_STEP_NUM_TASKS";
// The node a task runs on, as Slurm names it.
inline constexpr char kSlurmdNodeName[] = "SLURMD_NODENAME";

// lockstep's own.
inline constexpr char kLogLevel[] = "LOCKSTEP_LOG_LEVEL";
inline constexpr char kBackend[] = "LOCKSTEP_BACKEND";
inline constexpr char kTimeout[] = "LOCKSTEP_TIMEOUT";
inline constexpr char kConnectTimeout[] = "LOCKSTEP_CONNECT_TIMEOUT";
inline constexpr char kStoreToken[] = "LOCKSTEP_STORE_TOKEN";
// Set by `lockstep run`: where its launcher hosts lockstep's store. MASTER_ADDR
// and MASTER_PORT are then left to the program (a torch.distributed rank 0
// listens there), as under torchrun.
inline constexpr char kStoreAddr[] = "LOCKSTEP_STORE_ADDR";
inline constexpr char kStorePort[] = "LOCKSTEP_STORE_PORT";
inline constexpr char kRunId[] = "LOCKSTEP_RUN_ID";
inline constexpr char kRestartCount[] = "LOCKSTEP_RESTART_COUNT";
// Set by `lockstep run`: what it does when a rank dies (restart|continue).
inline constexpr char kOnRankFailure[] = "LOCKSTEP_ON_RANK_FAILURE";
// Set by `lockstep run --max-replacements`: which start of this rank in the
// round this process is (0: the first; more: a replacement, which joins the
// running group instead of forming the world).
inline constexpr char kIncarnation[] = "LOCKSTEP_INCARNATION";
// Set by `lockstep run --on-rank-failure continue --max-replacements N`
// (N > 0): the launchers start a rank that died again, so a survivor that
// lost one may wait a moment for its launcher to say whether it did.
inline constexpr char kMaxReplacements[] = "LOCKSTEP_MAX_REPLACEMENTS";
inline constexpr char kHostId[] = "LOCKSTEP_HOST_ID";
inline constexpr char kSocketAddr[] = "LOCKSTEP_SOCKET_ADDR";
inline constexpr char kTcpSmallBytes[] = "LOCKSTEP_TCP_SMALL_BYTES";
inline constexpr char kShmOneShotBytes[] = "LOCKSTEP_SHM_ONESHOT_BYTES";
inline constexpr char kShmChunkBytes[] = "LOCKSTEP_SHM_CHUNK_BYTES";
inline constexpr char kCudaStagingChunkBytes[] = "LOCKSTEP_CUDA_STAGING_CHUNK_BYTES";
inline constexpr char kShmSpinMicros[] = "LOCKSTEP_SHM_SPIN_US";
inline constexpr char kShmTag[] = "LOCKSTEP_SHM_TAG";
inline constexpr char kShmSingleCopyBytes[] = "LOCKSTEP_SHM_SINGLE_COPY_BYTES";
inline constexpr char kShmStreamingStores[] = "LOCKSTEP_SHM_STREAMING_STORES";
inline constexpr char kShmOrdinaryPath[] = "LOCKSTEP_SHM_ORDINARY_PATH";
inline constexpr char kDebug[] = "LOCKSTEP_DEBUG";
inline constexpr char kTrace[] = "LOCKSTEP_TRACE";
inline constexpr char kStats[] = "LOCKSTEP_STATS";
inline constexpr char kFlightDir[] = "LOCKSTEP_FLIGHT_DIR";
inline constexpr char kWatchdogSettle[] = "LOCKSTEP_WATCHDOG_SETTLE";
inline constexpr char kStallWarning[] = "LOCKSTEP_STALL_WARNING";
inline constexpr char kMpiMaxCount[] = "LOCKSTEP_MPI_MAX_COUNT";
inline constexpr char kMpiAbortOnFailure[] = "LOCKSTEP_MPI_ABORT_ON_FAILURE";

}  // namespace lockstep::env
