// `lockstep run` started by srun, one launcher per node: what its options
// leave open comes from Slurm, so that
//   srun --ntasks-per-node=1 lockstep run --nproc-per-node 4 -- program
// needs no --nnodes, --node-rank or address by hand. torchrun reads none of
// Slurm's variables; users compute them in the batch script instead.
#pragma once

#include "lockstep/config.h"
#include "run/run_command.h"

namespace lockstep::cli {

// `o` with, when srun started this launcher on a step of several nodes and
// the command line sets none of --nnodes, --node-rank, --master-addr,
// --master-port or --rdzv-endpoint: --nnodes from SLURM_STEP_NUM_NODES,
// --node-rank from SLURM_NODEID, the store on the step's first node
// (SLURM_STEP_NODELIST) at 15000 + the job id's last four digits, and
// --rdzv-id from SLURM_JOB_ID and SLURM_STEP_ID. Several launchers on one
// node (more tasks than nodes) are a ConfigError naming the fix. Otherwise
// `o` as it is. `note` says what was taken, for the launcher's first line.
RunOptions with_slurm_defaults(RunOptions o, const Config::Lookup& lookup, std::string* note);

}  // namespace lockstep::cli
