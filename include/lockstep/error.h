// The exceptions lockstep throws at its API boundary. Every message names this
// rank, the peer or the missing ranks, the collective and its sequence number
// where they apply, and says what to do. See docs/errors.md.
// Exception objects are immutable after construction; safe to share across threads.
#pragma once

#include <stdexcept>
#include <string>

namespace lockstep {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait passed its deadline. `peer()` is the rank that was waited for, or -1
// when the wait was not on a single peer.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what, int peer = -1) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// A peer died or its connection broke. `peer()` is that peer's rank in the
// group that noticed, or -1 if unknown.
class PeerError : public Error {
 public:
  explicit PeerError(const std::string& what, int peer = -1) : Error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Ranks disagree: on the collective, a shape, a dtype, a parameter list.
class MismatchError : public Error {
 public:
  using Error::Error;
};

// A caller passed an argument that cannot work (wrong sizes, bad rank, ...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Bad configuration from the environment or the launcher: missing or
// inconsistent variables, an unreachable store, a port in use.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A replacement (LOCKSTEP_INCARNATION > 0) found the group it would join
// already finished: the job's work is done, and the process should exit 0.
class JobFinished : public Error {
 public:
  using Error::Error;
};

}  // namespace lockstep
