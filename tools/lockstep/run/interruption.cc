// Signals while the launcher waits; see interruption.h.
#include "run/interruption.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "common/socket.h"

namespace lockstep::cli {
namespace {

// How often a wait looks at the signalfd: short enough that Ctrl-C feels
// immediate, long enough that polling the store costs nothing.
constexpr Duration kSlice = std::chrono::milliseconds(100);

}  // namespace

void throw_if_interrupted(int signal_fd, const std::string& waiting_for) {
  signalfd_siginfo info{};
  while (::read(signal_fd, &info, sizeof info) == sizeof info) {
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig != SIGCHLD)  // the others in the signalfd are the ones --signals-to-handle names
      throw Interrupted(sig, fmt::format("received SIG{} while waiting for {}; stopping", sigabbrev_np(sig),
                                         waiting_for));
  }
}

void publish_interruption(Store& store, const std::string& what, const std::string& key) {
  try {
    store.compare_set(key, "", what);
  } catch (const std::exception&) {
    // The store is gone: the others learn it from that.
  }
}

void throw_if_peer_interrupted(Store& store, const std::string& key) {
  if (store.check({key})) throw PeerError(fmt::format("stopping: {}", store.get(key)));
}

bool wait_for_keys(Store& store, const std::vector<std::string>& keys, Deadline deadline, int signal_fd,
                   const std::string& waiting_for, Os& clock) {
  for (;;) {
    throw_if_interrupted(signal_fd, waiting_for);
    if (store.check(keys)) return true;
    throw_if_peer_interrupted(store);
    if (expired(clock, deadline)) return false;
    std::this_thread::sleep_for(std::min(kSlice, remaining(clock, deadline)));
  }
}

void wait_for_listener(const std::string& host, std::uint16_t port, Deadline deadline, int signal_fd, Os& clock) {
  const std::string waiting_for = fmt::format("node 0's store at {}", format_endpoint(host, port));
  for (;;) {
    throw_if_interrupted(signal_fd, waiting_for);
    try {
      // A probe connection, closed at once; the store logs nothing for it.
      // Each try is a slice of real time (connect_tcp's clock), no longer
      // than what is left on `clock`.
      connect_tcp(host, port, Deadline::after(std::min(kSlice, remaining(clock, deadline))));
      return;
    } catch (const ConfigError&) {
      if (expired(clock, deadline)) throw;
    }
  }
}

}  // namespace lockstep::cli
