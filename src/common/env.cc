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

std::optional<std::int64_t> env_int(const char* name, std::int64_t min, std::int64_t max) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  auto v = parse_int(*text);
  if (!v || *v < min || *v > max)
    throw ConfigError(fmt::format("{}='{}' is {}; set it to a whole number from {} to {}, or unset it", name, *text,
                                  v ? "out of range" : "not an integer", min, max));
  return v;
}

std::optional<Duration> env_seconds(const char* name) {
  auto text = env_string(name);
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
