// Supervises one attempt of a job on this node: relays every rank's output,
// notices each exit, and when a rank fails (or the launcher is told to stop,
// or another node reports a failure) stops the rest: SIGTERM to each rank's
// process group, SIGKILL after the grace period. It returns only when every
// rank has been reaped, so no process is ever left behind.
//
// Signals reach the launcher through a signalfd (they are blocked), so there
// are no signal handlers and no global state. Not thread-safe.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/os.h"
#include "run/rank_process.h"

namespace lockstep::cli {

struct RankFailure {
  int rank = -1;
  ExitStatus status;
  double seconds = 0;                   // how long it ran
  std::vector<std::string> last_stderr;  // its last lines
  std::string error_file;                // what it wrote to TORCHELASTIC_ERROR_FILE, if anything
  std::filesystem::path error_file_path;
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
  // With continue_after_rank_failure: the ranks that died while the others
  // went on (the attempt is ok when every rank still running after the last
  // of them exited 0).
  std::vector<int> survived_loss_of;
  // The ranks started again after a death (--max-replacements), in order.
  std::vector<int> replaced;
  // With continue_after_rank_failure: ranks outlived a death but did not
  // all exit 0: the program could not go on in place (it does not re-form
  // its group, or its state cannot survive), and the job falls back to the
  // restart. The first such rank's last words.
  std::optional<RankFailure> could_not_go_on;
  // With continue_after_rank_failure: every rank of this node died (none
  // outlived the last death, and none failed for not going on), so the
  // attempt failed here; where other nodes' ranks go on without them, the
  // job's outcome is theirs (attempt_loop.cc waits for it).
  bool none_left = false;
};

struct SupervisorOptions {
  bool prefix_output = true;
  bool unprefixed_rank0 = false;
  // Per local rank (index in `ranks`), the attempt's directory of that rank
  // in torchrun's layout (<run>/attempt_<k>/<local rank>/): its error file
  // (error.json, TORCHELASTIC_ERROR_FILE) and, with write_logs, its
  // stdout.log and stderr.log.
  std::vector<std::filesystem::path> rank_dirs;
  bool write_logs = false;
  // torchrun's --tee and --redirects (run_arguments.h), applied to each
  // rank by its local rank. Both empty: with write_logs, both streams go
  // to the console and to the logs.
  std::string tee;
  std::string redirects;
  std::set<int> console_ranks;  // --local-ranks-filter: local ranks shown on the console (empty: all)
  // --duplicate-std{out,err}-filters: lines containing any of these also go
  // to <attempt_dir>/filtered_std{out,err}.log, shared by the node's ranks.
  std::vector<std::string> stdout_filters;
  std::vector<std::string> stderr_filters;
  std::filesystem::path attempt_dir;
  Duration grace = std::chrono::seconds(5);
  // Polled every monitor_interval; a non-empty answer is another node's
  // failure (or another reason to stop this attempt's ranks).
  Duration monitor_interval = std::chrono::milliseconds(200);
  std::function<std::optional<std::string>()> remote_failure;
  // --on-rank-failure continue: a rank that dies does not stop the others;
  // `rank_lost` (if set) is told its global rank at once (after its
  // replacement, if any, was started: the survivors read the start first),
  // and the attempt succeeds if every rank that outlived the last death
  // exits 0.
  bool continue_after_rank_failure = false;
  // `incarnation`: which start of the rank in the round ended (0: the
  // first; its replacements count up).
  std::function<void(int rank, int incarnation)> rank_lost;
  // With continue_after_rank_failure: a rank that died is started again
  // (its replacement joins the running group), up to `replacements` times
  // for this node's ranks together; `start_replacement` starts local rank
  // `local`'s start `incarnation`.
  // `next_incarnation` (if set) numbers a replacement of global rank `rank`
  // (the launchers' shared count, so that a node taking a lost one's place
  // never reuses a number); else it is its predecessor's plus one.
  int replacements = 0;
  std::function<RankProcess(std::size_t local, int incarnation)> start_replacement;
  std::function<int(int rank)> next_incarnation;
  // Per local rank: which start of the rank `ranks` holds (empty: all 0,
  // the first; a node that took a lost one's place starts replacements).
  std::vector<int> incarnations;
  // Whether a replacement joined the running group (it ended without
  // joining when the job finished first: it does not count as going on).
  std::function<bool(int rank, int incarnation)> joined;
  // With continue_after_rank_failure, polled every monitor_interval for
  // each rank still running (by its global rank): true once its peers
  // re-formed their group without it (frozen, cut off). The supervisor
  // kills it, and it counts as lost.
  std::function<bool(int rank, int incarnation)> dropped;
  // The clock the grace period, the settling of a failure's cause and the
  // monitor interval are measured on (the loop itself polls its pipes in
  // real time). Never null; tests move a clock of their own.
  Os* clock = &Os::real();
};

// `signal_fd` is a signalfd for SIGCHLD, SIGINT, SIGTERM and SIGHUP.
AttemptResult supervise(std::vector<RankProcess>& ranks, int signal_fd, const SupervisorOptions& options);

}  // namespace lockstep::cli
