// SIGUSR1 flight-recorder dumps; see signal_dumps.h.
#include "comm/signal_dumps.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/group_diagnostics.h"

namespace lockstep {
namespace {

// The process-wide state signals force on us; see the header.
struct Registry {
  std::mutex mutex;
  std::vector<GroupDiagnostics*> groups;
  int pipe_write = -1;
  bool installed = false;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the reader thread may outlive static destruction
  return *r;
}

extern "C" void on_sigusr1(int) {
  const char byte = 1;
  (void)!::write(registry().pipe_write, &byte, 1);  // async-signal-safe
}

void read_requests(int fd) {
  char byte;
  while (::read(fd, &byte, 1) > 0) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    for (GroupDiagnostics* g : r.groups) g->dump("SIGUSR1");
  }
}

// Installs the handler once, if SIGUSR1 has its default action.
void install(Registry& r) {
  if (r.installed) return;
  r.installed = true;
  struct sigaction current {};
  if (::sigaction(SIGUSR1, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  r.pipe_write = fds[1];
  std::thread(read_requests, fds[0]).detach();
  struct sigaction action {};
  action.sa_handler = on_sigusr1;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &action, nullptr);
}

}  // namespace

void register_for_signal_dumps(GroupDiagnostics* diagnostics) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  install(r);
  r.groups.push_back(diagnostics);
}

void unregister_from_signal_dumps(GroupDiagnostics* diagnostics) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.groups.erase(std::remove(r.groups.begin(), r.groups.end(), diagnostics), r.groups.end());
}

}  // namespace lockstep
