// Typed variable reads. Stateless; thread-safe (see env.h).
#include "common/env.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/env_vars.h"
#include "lockstep/error.h"

namespace lockstep {

// The one place lockstep reads its environment.
std::optional<std::string> environment_lookup(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<std::int64_t> parse_int(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0') return std::nullopt;
  return v;
}

std::optional<std::int64_t> VariableReader::integer(const char* name) const {
  auto text = string(name);
  if (!text) return std::nullopt;
  auto v = parse_int(*text);
  if (!v) throw ConfigError(fmt::format("{}='{}' is not an integer; set it to a whole number or unset it", name, *text));
  return v;
}

std::optional<std::int64_t> VariableReader::integer(const char* name, std::int64_t min, std::int64_t max) const {
  auto text = string(name);
  if (!text) return std::nullopt;
  auto v = parse_int(*text);
  if (!v || *v < min || *v > max)
    throw ConfigError(fmt::format("{}='{}' is {}; set it to a whole number from {} to {}, or unset it", name, *text,
                                  v ? "out of range" : "not an integer", min, max));
  return v;
}

std::optional<Duration> VariableReader::seconds(const char* name) const {
  auto text = string(name);
  if (!text) return std::nullopt;
  // Checked as a double, before the conversion to milliseconds: 1e300 would
  // overflow it, and anything under half a millisecond would round to 0.
  const double max_seconds = std::chrono::duration<double>(kMaxTimeout).count();
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || !std::isfinite(seconds) || seconds < 0.001 || seconds > max_seconds)
    throw ConfigError(fmt::format("{}='{}' is not a duration lockstep accepts; set it to a number of seconds from "
                                  "0.001 to {:.0f} (a week), e.g. {}=300, or unset it",
                                  name, *text, max_seconds, name));
  return Duration(static_cast<std::int64_t>(std::llround(seconds * 1000.0)));
}

std::optional<bool> VariableReader::flag(const char* name) const {
  auto text = string(name);
  if (!text) return std::nullopt;
  for (const char* yes : {"1", "true", "yes", "on", "TRUE", "True", "YES", "ON"})
    if (*text == yes) return true;
  for (const char* no : {"0", "false", "no", "off", "FALSE", "False", "NO", "OFF"})
    if (*text == no) return false;
  throw ConfigError(fmt::format("{}='{}' is not a flag; use 1 or 0", name, *text));
}

std::optional<std::string> env_string(const char* name) { return environment_lookup(name); }

std::optional<std::int64_t> env_int(const char* name) { return VariableReader(environment_lookup).integer(name); }

std::optional<std::int64_t> env_int(const char* name, std::int64_t min, std::int64_t max) {
  return VariableReader(environment_lookup).integer(name, min, max);
}

std::optional<Duration> env_seconds(const char* name) { return VariableReader(environment_lookup).seconds(name); }

std::optional<bool> env_flag(const char* name) { return VariableReader(environment_lookup).flag(name); }

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // Comma-separated entries "N" or "N(xK)" (N tasks on each of K nodes).
  int index = 0;
  std::size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    std::size_t end = tasks_per_node.find(',', pos);
    if (end == std::string::npos) end = tasks_per_node.size();
    const std::string entry = tasks_per_node.substr(pos, end - pos);
    int tasks = 0, repeat = 1;
    if (std::sscanf(entry.c_str(), "%d(x%d)", &tasks, &repeat) < 1)
      throw ConfigError(fmt::format("{}='{}' is not a Slurm task list", env::kSlurmTasksPerNode, tasks_per_node));
    if (node < index + repeat) return tasks;
    index += repeat;
    pos = end + 1;
  }
  throw ConfigError(fmt::format("{}='{}' lists no node {}", env::kSlurmTasksPerNode, tasks_per_node, node));
}

}  // namespace lockstep
