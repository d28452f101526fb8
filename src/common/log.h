// Logging with a "[rank r/n]" prefix. A Logger is a small value: components
// keep their own copy, so there is no process-wide logger to configure. The
// level is given by whoever makes it (the front end takes Config::log_level,
// LOCKSTEP_LOG_LEVEL; default warn). Each message is written with one write(2) to stderr, so
// lines from threads and ranks do not interleave. Thread-safe.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

#include "lockstep/config.h"

namespace lockstep {

class Logger {
 public:
  // No rank prefix.
  explicit Logger(LogLevel level = LogLevel::warn) : level_(level) {}
  Logger(LogLevel level, std::string prefix) : level_(level), prefix_(std::move(prefix)) {}

  // The same level with a "[rank r/n]" prefix.
  Logger for_rank(int rank, int size) const;

  bool enabled(LogLevel level) const { return level <= level_; }
  LogLevel level() const { return level_; }

  template <typename... Args>
  void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) const {
    if (enabled(level)) write(level, fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void error(fmt::format_string<Args...> f, Args&&... args) const { log(LogLevel::error, f, std::forward<Args>(args)...); }
  template <typename... Args>
  void warn(fmt::format_string<Args...> f, Args&&... args) const { log(LogLevel::warn, f, std::forward<Args>(args)...); }
  template <typename... Args>
  void info(fmt::format_string<Args...> f, Args&&... args) const { log(LogLevel::info, f, std::forward<Args>(args)...); }
  template <typename... Args>
  void debug(fmt::format_string<Args...> f, Args&&... args) const { log(LogLevel::debug, f, std::forward<Args>(args)...); }

 private:
  void write(LogLevel level, std::string_view message) const;

  LogLevel level_;
  std::string prefix_;
};

}  // namespace lockstep
