// Supervises one attempt of a job on this node: relays every rank's output,
// notices each exit, and when a rank fails (or the launcher is told to stop,
// or another node reports a failure) stops the rest: SIGTERM to each rank's
// process group, SIGKILL after the grace period. It returns only when every
// rank has been reaped, so no process is ever left behind.
//
// Signals reach the launcher through a signalfd (they are blocked), so there
// are no signal handlers and no global state. Not thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "run/rank_process.h"

namespace lockstep::cli {

struct RankFailure {
  int rank = -1;
  ExitStatus status;
  double seconds = 0;                   // how long it ran
  std::vector<std::string> last_stderr;  // its last lines
  std::string reported_by;               // non-empty: another node's report
  // A rank of this node that exited cleanly (code 0) before this failure,
  // or within half a second after it (a rank still exiting), while others
  // still ran: a rank that left early (it issued fewer
  // collectives), the likely cause of the others' failure. -1: none.
  int left_early = -1;
  double left_early_seconds = 0;  // how long it ran
};

struct AttemptResult {
  bool ok = false;
  int interrupted_by = 0;  // the signal the launcher received, if any
  std::optional<RankFailure> first_failure;
};

struct SupervisorOptions {
  bool prefix_output = true;
  bool unprefixed_rank0 = false;
  std::string log_dir;  // empty: no per-rank log files
  // torchrun's --tee and --redirects (run_arguments.h), applied to each
  // rank by its local rank (its index in `ranks`). Both empty: with a
  // log_dir, both streams go to the console and the log.
  std::string tee;
  std::string redirects;
  int attempt = 0;
  Duration grace = std::chrono::seconds(5);
  // Polled every monitor_interval; a non-empty answer is another node's
  // failure (or another reason to stop this attempt's ranks).
  Duration monitor_interval = std::chrono::milliseconds(200);
  std::function<std::optional<std::string>()> remote_failure;
};

// `signal_fd` is a signalfd for SIGCHLD, SIGINT, SIGTERM and SIGHUP.
AttemptResult supervise(std::vector<RankProcess>& ranks, int signal_fd, const SupervisorOptions& options);

}  // namespace lockstep::cli
