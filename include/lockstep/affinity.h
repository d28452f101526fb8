// Placing ranks on cores.
#pragma once

namespace lockstep {

// Pins the calling thread (and the threads it starts later) to one core:
// the local_rank-th of the cores this process may use, wrapping around when
// ranks outnumber them. Benchmarks use it so that ranks do not migrate
// between cores or share one while others idle. Does nothing where the
// affinity cannot be read or set.
void pin_to_core_of_local_rank(int local_rank);

// The number of cores this process may run on (its affinity mask, as
// taskset, cgroups' cpusets and mpirun's binding set it), at least 1.
int usable_cores();

}  // namespace lockstep
