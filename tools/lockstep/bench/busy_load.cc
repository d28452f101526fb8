// Spinning processes beside the ranks; see busy_load.h.
#include "bench/busy_load.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

[[noreturn]] void spin_until_killed(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(0);  // the parent died before the line above
  volatile unsigned long counter = 0;
  for (;;) counter = counter + 1;  // pure computation: no system calls, no memory traffic
}

}  // namespace

BusyLoad::BusyLoad(int processes) {
  const pid_t parent = ::getpid();
  for (int i = 0; i < processes; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) spin_until_killed(parent);
    if (pid < 0) {
      const int err = errno;
      stop();  // the ones already started
      throw Error(fmt::format("--busy: cannot start busy process {} of {}: {}", i + 1, processes, std::strerror(err)));
    }
    children_.push_back(pid);
  }
}

BusyLoad::~BusyLoad() { stop(); }

void BusyLoad::stop() {
  for (pid_t pid : children_) ::kill(pid, SIGKILL);
  for (pid_t pid : children_) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  children_.clear();
}

}  // namespace lockstep::cli
