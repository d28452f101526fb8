// ProcessRanks; see process_ranks.h.
#include "harness/process_ranks.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::testing {
namespace {

int exit_code_for(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const PeerError& x) {
    std::fprintf(stderr, "PeerError: %s\n", x.what());
    return kExitPeerError;
  } catch (const TimeoutError& x) {
    std::fprintf(stderr, "TimeoutError: %s\n", x.what());
    return kExitTimeoutError;
  } catch (const ConfigError& x) {
    std::fprintf(stderr, "ConfigError: %s\n", x.what());
    return kExitConfigError;
  } catch (const MismatchError& x) {
    std::fprintf(stderr, "MismatchError: %s\n", x.what());
    return kExitMismatchError;
  } catch (const InvalidArgument& x) {
    std::fprintf(stderr, "InvalidArgument: %s\n", x.what());
    return kExitInvalidArgument;
  } catch (const std::exception& x) {
    std::fprintf(stderr, "error: %s\n", x.what());
    return kExitOtherError;
  }
}

const char* exit_name(int code) {
  switch (code) {
    case kExitOk: return "ok";
    case kExitPeerError: return "PeerError";
    case kExitTimeoutError: return "TimeoutError";
    case kExitConfigError: return "ConfigError";
    case kExitMismatchError: return "MismatchError";
    case kExitInvalidArgument: return "InvalidArgument";
    default: return "other error";
  }
}

// Every process's parent and process group, from /proc.
struct ProcessTable {
  std::map<pid_t, pid_t> parent;
  std::map<pid_t, pid_t> group;
};

ProcessTable read_process_table() {
  ProcessTable table;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0, pgrp = 0;
    if (!(rest >> state >> ppid >> pgrp)) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    table.parent[pid] = ppid;
    table.group[pid] = pgrp;
  }
  return table;
}

// The processes a rank left behind or still runs: the members of its
// process group (orphans keep it) and every descendant (which may have left
// the group), the rank itself excluded.
std::set<pid_t> tree_of(pid_t rank) {
  const ProcessTable table = read_process_table();
  std::set<pid_t> tree;
  for (const auto& [pid, group] : table.group)
    if (group == rank && pid != rank) tree.insert(pid);
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& [pid, parent] : table.parent)
      if ((parent == rank || tree.count(parent) != 0) && pid != rank && tree.insert(pid).second) grew = true;
  }
  return tree;
}

// SIGKILLs everything a rank started, until nothing is left to find, and
// reaps what was handed to this process (a subreaper, see ProcessRanks).
// The rank itself is left for the caller to reap (its status is wanted).
void kill_tree(pid_t rank) {
  for (int round = 0; round < 50; ++round) {
    const std::set<pid_t> tree = tree_of(rank);
    if (tree.empty()) return;
    for (pid_t pid : tree) ::kill(pid, SIGKILL);
    for (pid_t pid : tree) ::waitpid(pid, nullptr, WNOHANG);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ProcessRanks::ProcessRanks(int n, const std::function<EnvMap(int)>& env_for, const std::function<void(int)>& fn)
    : reaped_(static_cast<std::size_t>(n), false) {
  char tmpl[] = "/tmp/lockstep-ranks-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  // Orphans of the ranks' children come to this process rather than to
  // init, so nothing they start can outlive the test unseen (kill_tree).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      // A process group of its own: what it starts can be found and killed
      // with it, even after it is gone.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(kExitOtherError);  // parent died before prctl
      const int log = ::open(fmt::format("{}/rank{}.log", dir_, r).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      // A failing group writes its flight recorder to the temporary
      // directory: here that is this run's own, which goes with it, where
      // thousands of tests' dumps would otherwise pile up in /tmp. Where
      // the environment or env_for names a directory, that one.
      ::setenv("LOCKSTEP_FLIGHT_DIR", dir_.c_str(), /*overwrite=*/0);
      for (const auto& [k, v] : env_for(r)) ::setenv(k.c_str(), v.c_str(), 1);
      int code = kExitOk;
      try {
        fn(r);
      } catch (...) {
        code = exit_code_for(std::current_exception());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    ::setpgid(pid, pid);  // also here, so the group exists before anything signals it
    pids_.push_back(pid);
  }
}

ProcessRanks::~ProcessRanks() {
  for (std::size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    ::kill(pids_[i], SIGKILL);
    kill_tree(pids_[i]);
    ::waitpid(pids_[i], nullptr, 0);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void ProcessRanks::signal(int rank, int sig) { ::kill(pid(rank), sig); }

std::vector<RankResult> ProcessRanks::wait_all(Duration deadline_after) {
  const Deadline deadline = Deadline::after(deadline_after);
  std::vector<RankResult> results(pids_.size());
  std::size_t left = 0;
  for (std::size_t i = 0; i < pids_.size(); ++i) {
    results[i].rank = static_cast<int>(i);
    if (!reaped_[i]) ++left;
  }
  while (left > 0) {
    for (std::size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      // Ended (still a zombie, so its pid and group cannot be taken by
      // another process yet), or killed at the deadline: what it started
      // goes with it before it is reaped.
      // (ECHILD: reaped elsewhere; its status is lost.)
      siginfo_t ended{};
      const int rc = ::waitid(P_PID, static_cast<id_t>(pids_[i]), &ended, WEXITED | WNOHANG | WNOWAIT);
      const bool exited = (rc == 0 && ended.si_pid == pids_[i]) || (rc != 0 && errno == ECHILD);
      if (!exited && !deadline.expired()) continue;
      results[i].ended = Clock::now();
      if (!exited) {
        ::kill(pids_[i], SIGKILL);
        results[i].hit_deadline = true;
      }
      kill_tree(pids_[i]);
      int status = 0;
      pid_t got = ::waitpid(pids_[i], &status, 0);  // SIGKILL cannot be caught or ignored
      if (got < 0 && errno == EINTR) got = ::waitpid(pids_[i], &status, 0);
      if (got == 0) continue;
      reaped_[i] = true;
      --left;
      if (got < 0) {
        results[i].status_lost = true;  // a status of 0 here would read as a clean exit
        continue;
      }
      if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
    }
    if (left > 0) {
      if (deadline.expired()) {
        for (std::size_t i = 0; i < pids_.size(); ++i)
          if (!reaped_[i]) ::kill(pids_[i], SIGKILL);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  }
  for (std::size_t i = 0; i < pids_.size(); ++i) results[i].output = read_file(fmt::format("{}/rank{}.log", dir_, i));
  return results;
}

std::string reachable_address() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string found;
  for (ifaddrs* a = all; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    found = text;
  }
  ::freeifaddrs(all);
  return found;
}

bool wait_for_file(const std::string& path, Duration timeout) {
  const Deadline deadline = Deadline::after(timeout);
  while (!deadline.expired()) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return ::access(path.c_str(), F_OK) == 0;
}

EnvMap rank_env(int rank, int ranks, int port, const std::string& backend, int timeout_s) {
  return EnvMap{{"RANK", std::to_string(rank)},
                {"WORLD_SIZE", std::to_string(ranks)},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(port)},
                {"LOCKSTEP_BACKEND", backend},
                {"LOCKSTEP_TIMEOUT", std::to_string(timeout_s)},
                {"LOCKSTEP_CONNECT_TIMEOUT", "60"}};
}

std::string describe(const RankResult& r) {
  std::string how = r.signal ? fmt::format("killed by signal {}", r.signal)
                             : fmt::format("exit {} ({})", r.exit_code, exit_name(r.exit_code));
  if (r.status_lost) how = "exit status lost (the process was reaped elsewhere)";
  if (r.hit_deadline) how += ", still running at the test deadline";
  // The head and the tail of a long output: an error's message comes first
  // and a backtrace after it (libtorch's c10::Error), a crash's last words last.
  constexpr std::size_t kPart = 1500;
  const std::string shown = r.output.size() <= 2 * kPart
                                ? r.output
                                : fmt::format("{}\n[... {} bytes ...]\n{}", r.output.substr(0, kPart),
                                              r.output.size() - 2 * kPart, r.output.substr(r.output.size() - kPart));
  return fmt::format("rank {} {}; output:\n{}", r.rank, how, shown);
}

}  // namespace lockstep::testing
