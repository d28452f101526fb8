// What a rank started by Slurm's srun learns from Slurm's variables beyond
// its place (config.cc reads SLURM_PROCID and the like): where the
// rendezvous store is. Task 0 of a step runs on the step's first node, so
// every task finds the store there without MASTER_ADDR, and on a port
// derived from the job's id without MASTER_PORT.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/env.h"

namespace lockstep {

// The first host of a Slurm host list ("node[01-04,07],gpu5" -> "node01";
// "rack[2-3]-n[07,09]" -> "rack2-n07"), zero padding as written. A list
// Slurm would not write (an unclosed bracket, an empty range) is a
// ConfigError naming `variable` and the list.
std::string slurm_first_host(const std::string& host_list, const char* variable);

// Where a task of srun finds the store, from Slurm's variables alone: the
// first node of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST), and port
// 15000 plus the last four digits of SLURM_JOB_ID (15000..24999, as PyTorch
// Lightning chooses it, so two jobs sharing a first node rarely collide).
// A part Slurm's variables lack stays empty; *_from say where each part
// came from, for messages ("the first node of SLURM_STEP_NODELIST=n[1-4]").
// Without `with_host` the node lists are not read (MASTER_ADDR given: a
// list this parser cannot read must not stop the job).
struct SlurmStore {
  std::string host;
  std::string host_from;
  std::optional<std::int64_t> job_id;
  std::optional<int> port;
  std::string port_from;
};
SlurmStore slurm_store(const VariableReader& vars, bool with_host = true);

}  // namespace lockstep
