// attempt_dir, program_master and rank_env; see rank_environment.h.
#include "run/rank_environment.h"

#include <cstdint>

#include <fmt/format.h>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/host.h"
#include "common/socket.h"
#include "lockstep/error.h"
#include "run/interruption.h"

namespace lockstep::cli {

std::filesystem::path attempt_dir(const JobIdentity& job, const Round& round, int local) {
  return job.run_dir / fmt::format("attempt_{}", round.number) / std::to_string(local);
}

Endpoint program_master(Store& store, const Round& round, bool single, const std::string& local_addr, int signal_fd,
                        Deadline deadline) {
  const std::string key = fmt::format("launcher/{}/master", round.number);
  if (round.node_rank == 0) {
    Endpoint master;
    master.host = single ? "127.0.0.1" : !local_addr.empty() ? local_addr : store.advertised_address();
    if (master.host.empty()) master.host = host_name();
    master.port = local_port(listen_tcp(single ? "127.0.0.1" : "", 0).fd());
    if (!single) store.set(key, format_endpoint(master.host, static_cast<std::uint16_t>(master.port)));
    return master;
  }
  if (!wait_for_keys(store, {key}, deadline, signal_fd, "node 0 to choose MASTER_ADDR and MASTER_PORT"))
    throw ConfigError(fmt::format("node 0 did not publish MASTER_ADDR/MASTER_PORT for round {} in time; is its "
                                  "launcher still running?",
                                  round.number));
  return parse_endpoint(store.get(key));
}

std::map<std::string, std::string> rank_env(const RunOptions& o, const Round& round, int nproc, int local,
                                            const JobIdentity& job, const Endpoint& master, int failures,
                                            int incarnation) {
  const std::string rank = std::to_string(round.first_rank + local);
  const std::string world = std::to_string(round.world_size);
  std::map<std::string, std::string> env{
      {env::kRank, rank},
      {env::kLocalRank, std::to_string(local)},
      {env::kWorldSize, world},
      {env::kLocalWorldSize, std::to_string(nproc)},
      {env::kGroupRank, std::to_string(round.node_rank)},
      {env::kGroupWorldSize, std::to_string(round.nnodes)},
      {env::kRoleRank, rank},  // one role: ranks within it are the global ranks
      {env::kRoleWorldSize, world},
      {env::kRoleName, o.role},
      // MASTER_* are the program's, as under torchrun's c10d rendezvous: a
      // torch.distributed rank 0 hosts its own store there. lockstep's
      // ranks find the launcher's store by LOCKSTEP_STORE_*.
      {env::kMasterAddr, master.host},
      {env::kMasterPort, std::to_string(master.port)},
      {env::kStoreAddr, job.store_addr},
      {env::kStorePort, std::to_string(job.store_port)},
      {env::kRunId, job.run_id},
      {env::kRestartCount, std::to_string(round.number)},
      {env::kOnRankFailure, o.on_rank_failure},
      {env::kShmTag, job.shm_tag},
      {env::kTorchelasticRunId, job.run_id},
      {env::kTorchelasticRestartCount, std::to_string(failures)},
      {env::kTorchelasticMaxRestarts, std::to_string(o.max_restarts)},
      {env::kTorchelasticUseAgentStore, "False"},
      {env::kTorchelasticErrorFile, (attempt_dir(job, round, local) / "error.json").string()},
  };
  if (!job.token.empty()) env[env::kStoreToken] = job.token;
  if (incarnation > 0) env[env::kIncarnation] = std::to_string(incarnation);
  if (o.on_rank_failure == "continue" && o.max_replacements > 0)
    env[env::kMaxReplacements] = std::to_string(o.max_replacements);
  if (!o.backend.empty()) env[env::kBackend] = o.backend;
  // As torchrun does: several ranks per node each using every core for
  // their math would oversubscribe the machine.
  if (nproc > 1 && !env_string("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  return env;
}

}  // namespace lockstep::cli
