// The flight recorder: each group keeps its last N operations (sequence
// number, what it was, its state and times, an optional label such as a DDP
// bucket) in a ring, so that when something goes wrong (a timeout, an
// error, SIGUSR1) the recent history of this rank can be dumped and
// compared with the other ranks'. Recording costs one short lock per state
// change. Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "lockstep/types.h"

namespace lockstep::diag {

enum class OpState : std::uint8_t { issued, started, completed, failed };
std::string_view to_string(OpState state);

struct OpRecord {
  std::uint64_t seq = 0;
  OpInfo info;
  OpState state = OpState::issued;
  std::int64_t issued_us = 0;
  std::int64_t started_us = 0;
  std::int64_t finished_us = 0;
  std::string label;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity = 1024);

  // `started`: it starts at once (runs on the issuing thread).
  void issued(std::uint64_t seq, const OpInfo& info, std::int64_t at_us, bool started = false);
  void started(std::uint64_t seq, std::int64_t at_us);
  void finished(std::uint64_t seq, bool ok, std::int64_t at_us);
  void label(std::uint64_t seq, std::string text);

  // The records still in the ring, oldest first.
  std::vector<OpRecord> snapshot() const;
  // The label of `seq`, if it is still in the ring and has one.
  std::string label_of(std::uint64_t seq) const;

  // A JSON document of the ring, for a dump file.
  std::string to_json(const std::string& self) const;
  // A few lines for a log: the last completed operation and the ones in flight.
  std::string summary() const;

 private:
  OpRecord* find(std::uint64_t seq);  // caller holds the lock

  mutable std::mutex mutex_;
  std::vector<OpRecord> ring_;
  std::uint64_t recorded_ = 0;  // records ever issued
};

}  // namespace lockstep::diag
