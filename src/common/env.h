// Typed reads of variables, from the environment (env_*) or from any lookup
// (VariableReader, which Config::parse uses). A malformed or out-of-range
// value is a ConfigError that names the variable, the value and what is
// accepted.
// Numbers are range-checked before they are converted to a narrower type, so
// a huge value can never wrap into a small or negative one.
// Reads only; thread-safe as long as nobody calls setenv concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/config.h"
#include "lockstep/types.h"

namespace lockstep {

// The longest timeout lockstep accepts, from the environment or in options:
// a week. Longer ones are typos (or overflow into a negative duration).
inline constexpr Duration kMaxTimeout = std::chrono::hours(24 * 7);

// Typed reads through a lookup (a test's map, or the environment).
class VariableReader {
 public:
  explicit VariableReader(Config::Lookup lookup) : lookup_(std::move(lookup)) {}

  std::optional<std::string> string(const char* name) const { return lookup_(name); }
  // A whole number in [min, max].
  std::optional<std::int64_t> integer(const char* name, std::int64_t min, std::int64_t max) const;
  // A whole number of any size: only for callers that check the range
  // themselves; prefer the bounded form above.
  std::optional<std::int64_t> integer(const char* name) const;
  // Seconds, fractional allowed ("30", "0.5"), from 1 ms to kMaxTimeout.
  std::optional<Duration> seconds(const char* name) const;
  // "1", "true", "yes", "on" / "0", "false", "no", "off".
  std::optional<bool> flag(const char* name) const;

 private:
  Config::Lookup lookup_;
};

// The process environment as a lookup (unset and empty are both null).
std::optional<std::string> environment_lookup(const char* name);

// Reads of the process environment, for the front ends (the CLI tools);
// library code takes a Config instead.
std::optional<std::string> env_string(const char* name);
// A whole number in [min, max].
std::optional<std::int64_t> env_int(const char* name, std::int64_t min, std::int64_t max);
// A whole number of any size: only for callers that check the range
// themselves; prefer the bounded form above.
std::optional<std::int64_t> env_int(const char* name);
// Seconds, fractional allowed ("30", "0.5"), from 1 ms to kMaxTimeout.
std::optional<Duration> env_seconds(const char* name);
// "1", "true", "yes", "on" / "0", "false", "no", "off".
std::optional<bool> env_flag(const char* name);

// Parses a whole string as an integer; nullopt if it is not one (or does
// not fit in 64 bits).
std::optional<std::int64_t> parse_int(const std::string& text);

// "16(x2),8" style Slurm task counts (SLURM_TASKS_PER_NODE): the count for
// node `node`.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace lockstep
