// One rank started by the launcher: a child process with its own process
// group (so signals reach its helpers too), the parent-death signal set (so
// it dies if the launcher is killed), and its stdout and stderr on pipes.
// Move-only; owned by the launcher's loop; not thread-safe.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/unique_fd.h"

namespace lockstep::cli {

struct ExitStatus {
  int code = -1;   // exit code, or -1 if killed by a signal
  int signal = 0;  // the signal that ended it
  bool ok() const { return code == 0; }
  // The launcher's own exit code for this status: the code, or 128 + signal.
  int as_exit_code() const { return code >= 0 ? code : 128 + signal; }
  std::string describe() const;
};

class RankProcess {
 public:
  // Forks and execs argv[0] (searched in PATH) with `env` added to the
  // launcher's environment. Throws lockstep::Error if fork fails; a failed
  // exec shows up as exit code 127 with the reason on stderr.
  RankProcess(int rank, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_.fd(); }
  int stderr_fd() const { return err_.fd(); }
  void close_stdout() { out_.close(); }
  void close_stderr() { err_.close(); }

  bool running() const { return running_; }
  const ExitStatus& status() const { return status_; }
  Clock::time_point started() const { return started_; }
  Clock::time_point ended() const { return ended_; }
  // Records the exit reported by waitpid.
  void exited(int wait_status);

  // Signals the rank's whole process group.
  void signal(int sig) const;

 private:
  int rank_;
  pid_t pid_ = -1;
  UniqueFd out_;
  UniqueFd err_;
  bool running_ = true;
  ExitStatus status_;
  Clock::time_point started_;
  Clock::time_point ended_;
};

}  // namespace lockstep::cli
