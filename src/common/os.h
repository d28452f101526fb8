// The operating system as lockstep sees it: every system call a fault can
// hide behind (socket I/O, the clock deadlines are measured on, shared-memory
// segments, file writes) goes through one Os, so a test can replace a single
// call at an exact point — a short write, a reset connection, a stalled
// peer, a full disk, a clock jump — and assert what lockstep makes of it.
//
// Each method has the contract of the call it is named after (a return of -1
// with errno set, and so on); the base class makes the real call, so a test
// overrides only the calls it breaks and forwards the rest. Os::real() is
// the shared, stateless default. Thread-safety: the real Os is stateless and
// safe from any thread; a test's Os must be safe from the threads it is
// handed to.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>

#include "common/clock.h"

namespace lockstep {

class Os {
 public:
  virtual ~Os() = default;

  // The stateless default: the real calls.
  static Os& real();

  // Time. now() is the clock deadlines are measured on (CLOCK_MONOTONIC);
  // sleep_for waits on it. coarse_now() is the same clock at a kernel
  // tick's resolution, cheaper to read (common/clock.h); a test Os that
  // moves now() moves it too. Code that waits with a deadline reads the
  // time here, never from Clock::now(), so a test can run a 60-second
  // timeout in no time.
  virtual Clock::time_point now();
  virtual Clock::time_point coarse_now();
  virtual void sleep_for(Duration d);

  // Sockets.
  virtual ssize_t send(int fd, const void* data, std::size_t len, int flags);
  virtual ssize_t recv(int fd, void* data, std::size_t len, int flags);
  virtual int poll(pollfd* fds, nfds_t count, int timeout_ms);
  virtual int connect(int fd, const sockaddr* addr, socklen_t len);
  // accept4(2) without the peer's address.
  virtual int accept(int listener, int flags);

  // Files.
  virtual int open(const char* path, int flags, mode_t mode);
  virtual ssize_t write(int fd, const void* data, std::size_t len);
  virtual int fsync(int fd);
  virtual int rename(const char* from, const char* to);
  virtual int unlink(const char* path);
  virtual int close(int fd);

  // Shared memory. allocate() has posix_fallocate's contract: it returns the
  // error number instead of setting errno.
  virtual int shm_open(const char* name, int flags, mode_t mode);
  virtual int shm_unlink(const char* name);
  virtual int ftruncate(int fd, off_t len);
  virtual int allocate(int fd, off_t len);
  virtual void* mmap_shared(int fd, std::size_t len);
  virtual int munmap(void* addr, std::size_t len);

 protected:
  Os() = default;
  Os(const Os&) = default;
  Os& operator=(const Os&) = default;
};

// A deadline read on `os`'s clock: the milliseconds poll(2) may wait (rounded
// up, at most `cap`, -1 for no cap), and whether it has passed.
inline int poll_timeout_ms(Os& os, Deadline deadline, int cap = -1) {
  return deadline.poll_timeout_ms_at(os.now(), cap);
}
inline bool expired(Os& os, Deadline deadline) { return deadline.expired_at(os.now()); }
// A deadline `d` from now on `os`'s clock, and the time left before it.
inline Deadline deadline_after(Os& os, Duration d) { return Deadline::starting_at(os.now(), d); }
inline Duration remaining(Os& os, Deadline deadline) { return deadline.remaining_at(os.now()); }

}  // namespace lockstep
