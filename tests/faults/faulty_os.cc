// A fault-injecting Os; see faulty_os.h.
#include "faults/faulty_os.h"

#include <cerrno>

namespace lockstep::testing {

void FaultyOs::fail(Call call, int nth, int error) {
  std::lock_guard lock(mutex_);
  script(call).fail_nth = nth;
  script(call).error = error;
}

void FaultyOs::fail_from(Call call, int nth, int error) {
  std::lock_guard lock(mutex_);
  script(call).fail_from_nth = nth;
  script(call).error = error;
}

void FaultyOs::shorten(Call call, int nth, std::size_t max_bytes) {
  std::lock_guard lock(mutex_);
  script(call).shorten_from = nth;
  script(call).max_bytes = max_bytes;
}

void FaultyOs::stall_polls_from(int nth) {
  std::lock_guard lock(mutex_);
  stall_from_ = nth;
}

void FaultyOs::jump_clock_after(Call call, int nth, Duration jump) {
  std::lock_guard lock(mutex_);
  script(call).jump_after = nth;
  script(call).jump = jump;
}

int FaultyOs::calls(Call call) const {
  std::lock_guard lock(mutex_);
  return scripts_[static_cast<std::size_t>(call)].calls;
}

Duration FaultyOs::ahead() const {
  std::lock_guard lock(mutex_);
  return ahead_;
}

int FaultyOs::begin(Call call, std::size_t* max_bytes) {
  std::lock_guard lock(mutex_);
  Script& s = script(call);
  const int n = ++s.calls;
  if (max_bytes && s.shorten_from && n >= *s.shorten_from && *max_bytes > s.max_bytes) *max_bytes = s.max_bytes;
  if ((s.fail_nth && n == *s.fail_nth) || (s.fail_from_nth && n >= *s.fail_from_nth)) return s.error;
  return 0;
}

void FaultyOs::end(Call call) {
  std::lock_guard lock(mutex_);
  Script& s = script(call);
  if (s.jump_after && s.calls == *s.jump_after) ahead_ += s.jump;
}

Clock::time_point FaultyOs::now() { return Os::now() + ahead(); }
Clock::time_point FaultyOs::coarse_now() { return Os::coarse_now() + ahead(); }

void FaultyOs::sleep_for(Duration d) {
  std::lock_guard lock(mutex_);
  ahead_ += d;
}

// Counts the call, fails it if scripted (-1 and errno, as the call would)
// or makes it with at most the bytes allowed; then applies a clock jump
// scheduled for it either way.
template <typename Real>
auto FaultyOs::faulted(Call call, std::size_t* max_bytes, Real real) {
  if (const int error = begin(call, max_bytes)) {
    end(call);
    errno = error;
    return decltype(real())(-1);
  }
  const auto rc = real();
  const int saved = errno;
  end(call);
  errno = saved;
  return rc;
}

ssize_t FaultyOs::send(int fd, const void* data, std::size_t len, int flags) {
  return faulted(Call::send, &len, [&] { return Os::send(fd, data, len, flags); });
}

ssize_t FaultyOs::recv(int fd, void* data, std::size_t len, int flags) {
  return faulted(Call::recv, &len, [&] { return Os::recv(fd, data, len, flags); });
}

int FaultyOs::poll(pollfd* fds, nfds_t count, int timeout_ms) {
  return faulted(Call::poll, nullptr, [&] {
    {
      std::lock_guard lock(mutex_);
      const bool stalled = stall_from_ && script(Call::poll).calls >= *stall_from_;
      if (stalled) {
        // A stalled peer: the whole wait passes and nothing arrives.
        if (timeout_ms > 0) ahead_ += std::chrono::milliseconds(timeout_ms);
        for (nfds_t i = 0; i < count; ++i) fds[i].revents = 0;
        return 0;
      }
    }
    return Os::poll(fds, count, timeout_ms);
  });
}

int FaultyOs::connect(int fd, const sockaddr* addr, socklen_t len) {
  return faulted(Call::connect, nullptr, [&] { return Os::connect(fd, addr, len); });
}

int FaultyOs::accept(int listener, int flags) {
  return faulted(Call::accept, nullptr, [&] { return Os::accept(listener, flags); });
}

int FaultyOs::open(const char* path, int flags, mode_t mode) {
  return faulted(Call::open, nullptr, [&] { return Os::open(path, flags, mode); });
}

ssize_t FaultyOs::write(int fd, const void* data, std::size_t len) {
  return faulted(Call::write, &len, [&] { return Os::write(fd, data, len); });
}

int FaultyOs::fsync(int fd) {
  return faulted(Call::fsync, nullptr, [&] { return Os::fsync(fd); });
}

int FaultyOs::rename(const char* from, const char* to) {
  return faulted(Call::rename, nullptr, [&] { return Os::rename(from, to); });
}

int FaultyOs::allocate(int fd, off_t len) {
  // posix_fallocate's contract: the error is returned, errno is untouched.
  if (const int error = begin(Call::allocate)) {
    end(Call::allocate);
    return error;
  }
  const int rc = Os::allocate(fd, len);
  end(Call::allocate);
  return rc;
}

}  // namespace lockstep::testing
