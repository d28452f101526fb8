// Test harness: the ranks of a world as forked processes, the way users run
// them. Each child gets its own environment (RANK, WORLD_SIZE, MASTER_ADDR,
// ...), runs a function, and exits with a code that says which lockstep
// error, if any, it ended with. The parent can signal any rank (to kill one
// mid-collective), and waits with a deadline: children still alive at the
// deadline are SIGKILLed and reported, and every child is reaped. Each child
// leads a process group of its own, and this process is made a subreaper
// (PR_SET_CHILD_SUBREAPER), so that when a child ends or is killed,
// everything it started (its group, its descendants, and their orphans,
// which come here rather than to init) is killed and reaped with it.
// Children also die with the parent (PR_SET_PDEATHSIG).
//
// Fork only from a test thread while no other threads exist (do not create
// process groups in the parent first). Not thread-safe.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/clock.h"
#include "lockstep/types.h"

namespace lockstep::testing {

// Exit codes of a rank process, by how its function ended.
enum RankExit : int {
  kExitOk = 0,
  kExitPeerError = 10,
  kExitTimeoutError = 11,
  kExitConfigError = 12,
  kExitMismatchError = 13,
  kExitInvalidArgument = 14,
  kExitOtherError = 15,
};

struct RankResult {
  int rank = -1;
  int exit_code = -1;   // -1 if killed by a signal
  int signal = 0;       // the signal that ended it, if any
  bool hit_deadline = false;
  // waitpid failed (the child was reaped by someone else: ECHILD), so how it
  // ended is unknown; exit_code stays -1, which no test takes for success.
  bool status_lost = false;
  Clock::time_point ended{};
  std::string output;   // its stdout and stderr
};

using EnvMap = std::map<std::string, std::string>;

// The environment of rank `rank` of `ranks` meeting at 127.0.0.1:`port`
// on `backend`, with collectives that give up after `timeout_s` (and 60 s
// to connect): what ProcessRanks' env_for returns for most tests.
EnvMap rank_env(int rank, int ranks, int port, const std::string& backend, int timeout_s);

class ProcessRanks {
 public:
  // Forks n children. Child r sets env_for(r) in its environment and runs
  // fn(r); a return is exit 0, an exception the matching RankExit (its
  // message goes to the child's output).
  ProcessRanks(int n, const std::function<EnvMap(int rank)>& env_for, const std::function<void(int rank)>& fn);
  ~ProcessRanks();
  ProcessRanks(const ProcessRanks&) = delete;
  ProcessRanks& operator=(const ProcessRanks&) = delete;

  int size() const { return static_cast<int>(pids_.size()); }
  pid_t pid(int rank) const { return pids_[static_cast<std::size_t>(rank)]; }
  void signal(int rank, int sig);
  // A directory private to this run, for marker files.
  const std::string& dir() const { return dir_; }

  // Waits for every child to exit, at most `deadline`.
  std::vector<RankResult> wait_all(Duration deadline);

 private:
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  std::string dir_;
};

// A TCP port for a test: harness/reserved_port.h (ReservedPort).

// An IPv4 address of this host other hosts could reach (not loopback), or
// "" when it has none.
std::string reachable_address();

// Waits until `path` exists; false on timeout.
bool wait_for_file(const std::string& path, Duration timeout);

// "rank 2 exit 10 (PeerError) after 0.3 s: <last lines of output>" for test failure messages.
std::string describe(const RankResult& r);

}  // namespace lockstep::testing
