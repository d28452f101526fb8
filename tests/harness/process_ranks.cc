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
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(kExitOtherError);  // parent died before prctl
      const int log = ::open(fmt::format("{}/rank{}.log", dir_, r).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
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
    pids_.push_back(pid);
  }
}

ProcessRanks::~ProcessRanks() {
  for (std::size_t i = 0; i < pids_.size(); ++i) {
    if (reaped_[i]) continue;
    ::kill(pids_[i], SIGKILL);
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
      int status = 0;
      pid_t got = ::waitpid(pids_[i], &status, WNOHANG);
      if (got < 0 && errno == EINTR) continue;
      // Killed before the blocking wait: a wait first never returned for a
      // child that runs for ever, and the deadline held nothing.
      if (got == 0 && deadline.expired()) {
        ::kill(pids_[i], SIGKILL);
        results[i].hit_deadline = true;
        got = ::waitpid(pids_[i], &status, 0);  // SIGKILL cannot be caught or ignored
      }
      if (got == 0) continue;
      reaped_[i] = true;
      --left;
      results[i].ended = Clock::now();
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
