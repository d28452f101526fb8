// Marking regions of a rank's timeline (written when LOCKSTEP_TRACE is set):
//
//   {
//     lockstep::TraceRegion region(*pg, "data loading", "data");
//     batch = next_batch();
//   }
//
// DistributedDataParallel marks forward, backward, every bucket and the wait
// at the end of backward by itself; collectives appear on their own track.
// Free when tracing is off. Not shared between threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "lockstep/process_group.h"

namespace lockstep {

// The clock of every lockstep timestamp: steady-clock microseconds.
inline std::int64_t trace_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class TraceRegion {
 public:
  TraceRegion(ProcessGroup& pg, std::string name, std::string track = "program")
      : pg_(pg), name_(std::move(name)), track_(std::move(track)), start_us_(pg.tracing() ? trace_now_us() : 0) {}
  ~TraceRegion() {
    if (start_us_ != 0) pg_.trace(std::move(name_), std::move(track_), start_us_, trace_now_us());
  }
  TraceRegion(const TraceRegion&) = delete;
  TraceRegion& operator=(const TraceRegion&) = delete;

 private:
  ProcessGroup& pg_;
  std::string name_;
  std::string track_;
  std::int64_t start_us_;
};

}  // namespace lockstep
