// The diagnostics of one group: its flight recorder, the timeline (shared
// by a world and its sub-groups), the record of the group's first failure,
// and the watchdog.
//
// The watchdog, step by step, when a collective times out on some rank:
//   1. that rank opens a round in the group's store (the first one wins),
//      naming the operation's sequence number N, and publishes its progress
//      (operations issued, the one running, the last completed);
//   2. every other rank's watchdog thread, which looks for a round twice a
//      second, publishes its progress too, even if its program is stuck
//      outside lockstep (in a sleep, in data loading);
//   3. the reporting rank waits (a few seconds at most) for everyone, then
//      composes the verdict: ranks that never reached N, ranks that did not
//      answer, and what each was running and last completed; the first
//      verdict stored is the one every rank uses;
//   4. every rank aborts the group with that verdict, so no rank hangs on a
//      collective the group can no longer finish, and dumps its flight
//      recorder.
//
// Thread-safety: on_failure runs on the thread that ran the failed
// operation; the watchdog has its own thread; the rest is thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/log.h"
#include "diag/flight_recorder.h"
#include "diag/tracer.h"
#include "lockstep/store.h"

namespace lockstep {

struct DiagnosticsSettings {
  bool detail = false;           // LOCKSTEP_DEBUG=DETAIL: fingerprint every collective
  std::string flight_dir;        // where flight-recorder dumps go
  Duration settle{5000};         // how long a watchdog round waits for all ranks
};

class GroupDiagnostics {
 public:
  GroupDiagnostics(std::shared_ptr<Store> store, int rank, int size, std::string name, Logger log,
                   std::shared_ptr<diag::Tracer> tracer, DiagnosticsSettings settings);
  ~GroupDiagnostics();
  GroupDiagnostics(const GroupDiagnostics&) = delete;
  GroupDiagnostics& operator=(const GroupDiagnostics&) = delete;

  diag::FlightRecorder& recorder() { return recorder_; }
  diag::Tracer* tracer() const { return tracer_.get(); }
  const std::shared_ptr<diag::Tracer>& shared_tracer() const { return tracer_; }
  const DiagnosticsSettings& settings() const { return settings_; }

  // The progress engine's abort hook: the first failure is recorded in the
  // store (later reports quote it); a timeout runs a watchdog round. Returns
  // the error to report.
  std::exception_ptr on_failure(std::exception_ptr error, std::uint64_t seq, const OpInfo& info);

  // Starts the watchdog thread; `abort` aborts this rank's group.
  void start_watchdog(std::function<void(std::exception_ptr)> abort);
  // Stops it (before whatever `abort` touches goes away). Idempotent.
  void stop_watchdog();

  // Writes the flight recorder to a file and logs a summary; returns the path.
  std::string dump(const std::string& reason);

 private:
  void watch();
  std::string progress() const;
  std::string collect_verdict(std::uint64_t seq, const std::string& what);

  std::shared_ptr<Store> store_;  // a clone of the group's store
  int rank_;
  int size_;
  std::string name_;
  Logger log_;
  std::shared_ptr<diag::Tracer> tracer_;
  DiagnosticsSettings settings_;
  diag::FlightRecorder recorder_;

  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::function<void(std::exception_ptr)> abort_;
  std::thread watchdog_;
};

}  // namespace lockstep
