// See lockstep/affinity.h.
#include "lockstep/affinity.h"

#include <sched.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace lockstep {

void pin_to_core_of_local_rank(int local_rank) {
  cpu_set_t allowed;
  if (local_rank < 0 || sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cores.push_back(c);
  if (cores.empty()) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cores[static_cast<std::size_t>(local_rank) % cores.size()], &one);
  sched_setaffinity(0, sizeof one, &one);
}

int usable_cores() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) return std::max(1, CPU_COUNT(&allowed));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace lockstep
