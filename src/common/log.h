// Logging with a "[rank r/n]" prefix. A Logger is a small value: components
// keep their own copy, so there is no process-wide logger to configure. The
// level comes from LOCKSTEP_LOG_LEVEL (error, warn, info, debug, trace;
// default warn). Each message is written with one write(2) to stderr, so
// lines from threads and ranks do not interleave. Thread-safe.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

namespace lockstep {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

class Logger {
 public:
  // Level from LOCKSTEP_LOG_LEVEL, no rank prefix.
  Logger();
  Logger(LogLevel level, std::string prefix) : level_(level), prefix_(std::move(prefix)) {}

  // The same level with a "[rank r/n]" prefix.
  Logger for_rank(int rank, int size) const;

  static LogLevel level_from_env();

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
