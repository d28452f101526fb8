// Facts about this host and process that several layers need: the host
// name, and random identifiers (job ids, store tokens, segment nonces).
#pragma once

#include <cstddef>
#include <string>

namespace lockstep {

// gethostname(), or "" if it fails.
std::string host_name();

// `bytes` random bytes from the kernel (getrandom) as lowercase hex (2 x bytes
// digits). Throws Error if they cannot be read: never a predictable token.
std::string random_hex(std::size_t bytes);

}  // namespace lockstep
