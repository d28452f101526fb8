// Logger output. Stateless apart from each Logger's own fields; thread-safe.
#include "common/log.h"

#include <unistd.h>

namespace lockstep {
namespace {

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "ERROR";
    case LogLevel::warn: return "WARN";
    case LogLevel::info: return "INFO";
    case LogLevel::debug: return "DEBUG";
    case LogLevel::trace: return "TRACE";
  }
  return "?";
}

}  // namespace

Logger Logger::for_rank(int rank, int size) const {
  return Logger(level_, fmt::format("[rank {}/{}] ", rank, size));
}

void Logger::write(LogLevel level, std::string_view message) const {
  std::string line = fmt::format("{}lockstep {}: {}\n", prefix_, level_name(level), message);
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n <= 0) return;  // stderr closed: nothing useful left to do
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace lockstep
