// What a launcher asks of comm once all of its ranks have exited: remove the
// shared-memory segments they left behind. Declared here, not in shm/, so the
// launcher depends on comm's public face rather than on a backend's private
// header; the shm backend defines it (src/comm/shm/region.cc). Thread-safe.
#pragma once

#include <cstddef>
#include <string>

namespace lockstep {

// Unlinks every /dev/shm/lockstep.<tag>.* segment that ranks started with
// LOCKSTEP_SHM_TAG=<tag> left; returns how many. A tag that is not a valid
// segment tag removes nothing.
std::size_t remove_launcher_segments(const std::string& tag);

}  // namespace lockstep
