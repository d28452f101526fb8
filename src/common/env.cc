// Typed environment reads. Stateless; thread-safe (see env.h).
#include "common/env.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "lockstep/error.h"

namespace lockstep {

std::optional<std::string> env_string(const char* name) {
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

std::optional<std::int64_t> env_int(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  auto v = parse_int(*text);
  if (!v) throw ConfigError(fmt::format("{}='{}' is not an integer; set it to a whole number or unset it", name, *text));
  return v;
}

std::optional<Duration> env_seconds(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || !std::isfinite(seconds) || seconds <= 0)
    throw ConfigError(fmt::format("{}='{}' is not a positive number of seconds; e.g. {}=300", name, *text, name));
  return Duration(static_cast<std::int64_t>(std::llround(seconds * 1000.0)));
}

std::optional<bool> env_flag(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  for (const char* yes : {"1", "true", "yes", "on", "TRUE", "True", "YES", "ON"})
    if (*text == yes) return true;
  for (const char* no : {"0", "false", "no", "off", "FALSE", "False", "NO", "OFF"})
    if (*text == no) return false;
  throw ConfigError(fmt::format("{}='{}' is not a flag; use 1 or 0", name, *text));
}

}  // namespace lockstep
