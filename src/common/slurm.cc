// See slurm.h.
#include "common/slurm.h"

#include <fmt/format.h>

#include <cstdint>

#include "common/env_vars.h"
#include "lockstep/error.h"

namespace lockstep {

std::string slurm_first_host(const std::string& host_list, const char* variable) {
  const auto bad = [&](std::string_view why) {
    return ConfigError(fmt::format("{}='{}' is not a Slurm host list ({}); set MASTER_ADDR to the host of task 0",
                                   variable, host_list, why));
  };
  // Hosts are separated by commas outside brackets; inside a bracket group
  // the first range's first value stands for the group.
  std::string host;
  std::size_t i = 0;
  while (i < host_list.size() && host_list[i] != ',') {
    if (host_list[i] != '[') {
      host += host_list[i++];
      continue;
    }
    const std::size_t close = host_list.find(']', i);
    if (close == std::string::npos) throw bad("a '[' without its ']'");
    const std::string group = host_list.substr(i + 1, close - i - 1);
    const std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      throw bad(fmt::format("'[{}]' does not start with a number", group));
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw bad("no host in it");
  return host;
}

SlurmStore slurm_store(const VariableReader& vars, bool with_host) {
  SlurmStore s;
  for (const char* name : {env::kSlurmStepNodeList, env::kSlurmJobNodeList}) {
    if (!with_host) break;
    if (const auto list = vars.string(name)) {
      s.host = slurm_first_host(*list, name);
      s.host_from = fmt::format("the first node of {}={}", name, *list);
      break;
    }
  }
  s.job_id = vars.integer(env::kSlurmJobId, 0, INT64_MAX);
  if (s.job_id) {
    s.port = 15000 + static_cast<int>(*s.job_id % 10000);
    s.port_from = fmt::format("15000 + the last four digits of {}={}", env::kSlurmJobId, *s.job_id);
  }
  return s;
}

}  // namespace lockstep
