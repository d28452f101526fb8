// The TimeoutError every store throws when keys do not appear in time, worded
// the same way for all of them. Stateless; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/types.h"

namespace lockstep {

TimeoutError store_wait_timeout(const std::string& store_name, const std::vector<std::string>& missing,
                                Duration waited);

}  // namespace lockstep
