// Typed reads of environment variables. A malformed value is a ConfigError
// that names the variable, the value and what was expected. Reads only;
// thread-safe as long as nobody calls setenv concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/types.h"

namespace lockstep {

std::optional<std::string> env_string(const char* name);
std::optional<std::int64_t> env_int(const char* name);
// Seconds, fractional allowed ("30", "0.5").
std::optional<Duration> env_seconds(const char* name);
// "1", "true", "yes", "on" / "0", "false", "no", "off".
std::optional<bool> env_flag(const char* name);

// Parses a whole string as an integer; nullopt if it is not one.
std::optional<std::int64_t> parse_int(const std::string& text);

}  // namespace lockstep
