// The timeline: complete events (a name, a track, a start and an end) kept
// in memory and written as a Chrome-trace / Perfetto JSON file, one file per
// rank; `lockstep run` merges the files of a job into one with a track per
// rank. Enabled by LOCKSTEP_TRACE=<path prefix>; when disabled, recording
// is a single branch. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace lockstep::diag {

class Tracer {
 public:
  // `path` empty: disabled. The file is "<path>.rank<r>.json".
  Tracer(std::string path, int rank);
  ~Tracer();  // writes the file (best effort)

  bool enabled() const { return !path_.empty(); }
  // Times are steady-clock microseconds (now_us).
  void event(std::string name, std::string track, std::int64_t start_us, std::int64_t end_us);
  // Writes (or rewrites) the file now; returns its path, or "" if disabled.
  std::string write() const;
  std::string file() const;

 private:
  struct Event {
    std::string name;
    std::string track;
    std::int64_t start_us;
    std::int64_t end_us;
  };
  std::string path_;
  int rank_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

// Merges per-rank trace files into one: every event keeps its rank as the
// process id, so viewers show one track group per rank. Returns the number
// of files merged; writes nothing if none could be read.
std::size_t merge_traces(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace lockstep::diag
