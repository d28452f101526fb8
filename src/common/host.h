// Facts about this host and process that several layers need: the host
// name, and random identifiers (job ids, store tokens, segment nonces).
#pragma once

#include <cstddef>
#include <string>

namespace lockstep {

// gethostname(), or "" if it fails.
std::string host_name();

// `bytes` random bytes from /dev/urandom as lowercase hex (2 x bytes digits).
std::string random_hex(std::size_t bytes);

}  // namespace lockstep
