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
// The stall inspector, earlier: an operation that has run for
// `stall_after` on some rank (half the timeout, at most a minute, by
// default) makes that rank's watchdog ask every rank's watchdog for its
// progress through the store and log a warning naming the ranks that have
// not reached the operation, while there is still time to look at them.
//
// Any other failure (a mismatch, a lost peer) is recorded in the store as
// the group's first failure; the other ranks' watchdogs see it within half
// a second and abort their groups with it (the operation they are in is
// cancelled), so every rank names the failure, not only the ones whose
// data path touched it.
//
// Thread-safety: on_failure runs on the thread that ran the failed
// operation; the watchdog has its own thread; the rest is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>

#include "common/log.h"
#include "common/os.h"
#include "diag/flight_recorder.h"
#include "diag/tracer.h"
#include "lockstep/store.h"

namespace lockstep {

struct DiagnosticsSettings {
  bool detail = false;           // LOCKSTEP_DEBUG=DETAIL: fingerprint every collective
  std::string flight_dir;        // where flight-recorder dumps go
  // How long a watchdog round waits for all ranks: live watchdogs answer
  // within kWatchInterval (0.5 s), so only a stopped or cut-off rank costs it.
  Duration settle{1000};
  Duration timeout{0};           // the group's collective timeout (for messages)
  // LOCKSTEP_STALL_WARNING: an operation running this long on a rank makes
  // its watchdog ask every rank where it is and warn, naming the ranks that
  // have not reached it, well before the timeout fails the group. 0: off.
  Duration stall_after{0};
  // Under `lockstep run`: its store, and the key its launcher sets before it
  // stops the ranks on purpose (common/launcher_keys.h). A peer lost once it is
  // set is that planned stop, reported as such: no failure, no dump.
  std::shared_ptr<Store> launcher_store;
  std::string launcher_stop_key;
};

class GroupDiagnostics {
 public:
  // Rounds and stall inspections measure time on `clock` (the group's Os,
  // the one its operations' times are read on; it must outlive this).
  GroupDiagnostics(std::shared_ptr<Store> store, int rank, int size, std::string name, Logger log,
                   std::shared_ptr<diag::Tracer> tracer, DiagnosticsSettings settings, Os& clock = Os::real());
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

  // Records `error` as this group's first failure (unless another rank's
  // came first), for the other ranks' watchdogs to abort with; returns the
  // first failure's message if it was another. Never throws.
  std::string record_failure(std::exception_ptr error);

  // Starts the watchdog thread; `abort` aborts this rank's group.
  void start_watchdog(std::function<void(std::exception_ptr)> abort);
  // Stops it (before whatever `abort` touches goes away). Idempotent.
  void stop_watchdog();

  // Writes the flight recorder to a file and logs a summary; returns the path.
  std::string dump(const std::string& reason);

 private:
  void watch();
  // record_failure's work: returns the first failure as stored (kind, peer,
  // message) when it was another.
  std::string record_failure_as_stored(std::exception_ptr error);
  // The stall inspector (watchdog thread): publish this rank's progress
  // for the other ranks' inspections; inspect this rank's own long wait.
  void answer_stall_queries();
  void inspect_stall();
  std::string progress() const;
  std::string collect_verdict(std::uint64_t seq, const std::string& what);
  // The launcher's reason, when it has said it is stopping the ranks on purpose.
  std::optional<std::string> planned_stop() const;

  std::shared_ptr<Store> store_;  // a clone of the group's store
  int rank_;
  int size_;
  std::string name_;
  Logger log_;
  std::shared_ptr<diag::Tracer> tracer_;
  DiagnosticsSettings settings_;
  Os& clock_;
  diag::FlightRecorder recorder_;

  std::atomic<bool> reported_failure_{false};  // this rank's own failure is in the store
  std::uint64_t answered_stall_query_ = 0;       // watchdog thread only
  std::uint64_t warned_stall_seq_ = ~std::uint64_t{0};

  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::function<void(std::exception_ptr)> abort_;
  std::thread watchdog_;
};

}  // namespace lockstep
