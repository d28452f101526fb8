// Ctrl-C and SIGTERM outside supervision. The launcher blocks its signals
// and reads them from a signalfd; while it waits for the other nodes (their
// rendezvous, node 0's store, the end of the job) it waits in short slices
// and reads that fd between them, so a signal stops it at once rather than
// when --rdzv-timeout runs out. Free functions; not thread-safe (one reader
// of the signalfd).
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "common/os.h"
#include "lockstep/error.h"
#include "lockstep/store.h"

namespace lockstep::cli {

// The launcher was told to stop by a signal while it waited.
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& message) : Error(message), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// Throws Interrupted if a handled signal (--signals-to-handle) is pending on
// `signal_fd` (others read from it are dropped). `waiting_for` completes
// "received SIGINT while waiting for ...".
void throw_if_interrupted(int signal_fd, const std::string& waiting_for);

// A launcher stopped by a signal while the nodes gather publishes it here,
// so the others stop at once (naming it) rather than at --rdzv-timeout.
inline constexpr char kInterruptedKey[] = "launcher/interrupted";

// Publishes `what` ("node 1 (host-b) received SIGINT ...") under `key`;
// never throws (the store may be gone already).
void publish_interruption(Store& store, const std::string& what, const std::string& key = kInterruptedKey);

// Throws PeerError with the published text if another launcher did.
void throw_if_peer_interrupted(Store& store, const std::string& key = kInterruptedKey);

// Polls until every key exists (true) or the deadline passes (false);
// throws Interrupted on a signal, PeerError if another launcher was. The
// deadline is read on `clock` (set on the same clock); polls are real time.
bool wait_for_keys(Store& store, const std::vector<std::string>& keys, Deadline deadline, int signal_fd,
                   const std::string& waiting_for, Os& clock = Os::real());

// Waits until host:port accepts connections (node 0's store is up); throws
// ConfigError naming the address at the deadline (read on `clock`).
void wait_for_listener(const std::string& host, std::uint16_t port, Deadline deadline, int signal_fd,
                       Os& clock = Os::real());

}  // namespace lockstep::cli
