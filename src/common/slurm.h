// What a rank started by Slurm's srun learns from Slurm's variables beyond
// its place (config.cc reads SLURM_PROCID and the like): where the
// rendezvous store is. Task 0 of a step runs on the step's first node, so
// every task finds the store there without MASTER_ADDR, and on a port
// derived from the job's id without MASTER_PORT.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

// The first host of a Slurm host list ("node[01-04,07],gpu5" -> "node01";
// "rack[2-3]-n[07,09]" -> "rack2-n07"), zero padding as written. A list
// Slurm would not write (an unclosed bracket, an empty range) is a
// ConfigError naming `variable` and the list.
std::string slurm_first_host(const std::string& host_list, const char* variable);

// The store's port for a job started by Slurm without MASTER_PORT:
// 15000 plus the job id's last four digits (15000..24999), as PyTorch
// Lightning chooses it, so two jobs sharing a first node rarely collide.
int slurm_store_port(std::int64_t job_id);

}  // namespace lockstep
