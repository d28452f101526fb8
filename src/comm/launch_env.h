// Where a process learns its place in the job: explicit options first, then
// the variables a launcher sets, as Config::parse read them. Recognised
// launchers, in order:
//   lockstep run / torchrun   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Open MPI (mpirun)         OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}
//   Slurm (srun)              SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...
// With none of them, the process is a world of one.
// The store's address comes from MASTER_ADDR / MASTER_PORT; under mpirun
// without them, from rank 0 through MPI (comm/mpi/bootstrap.h).
// Pure function of options and config; thread-safe.
#pragma once

#include <string>

#include "lockstep/config.h"
#include "lockstep/process_group.h"

namespace lockstep {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr;  // empty: none given
  int master_port = -1;
  LaunchSource source = LaunchSource::none;
  bool store_hosted = false;  // a launcher already runs the store server
  std::string run_id;         // namespaces the store's keys per job and restart
  std::string token;
  Duration timeout{0};
  Duration connect_timeout{0};
  bool mpi_abort_on_failure = true;
  // Launcher variables that contradicted themselves and were ignored
  // because the options gave the rank and size (Config::launcher_problem);
  // empty: none. init_process_group warns with it.
  std::string ignored_variables;
};

// Options override `config`. Throws ConfigError naming the setting, its
// value and the fix.
LaunchInfo resolve_launch(const GroupOptions& options, const Config& config);

}  // namespace lockstep
