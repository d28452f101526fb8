// An Os for fault tests: the real system calls, except where a test has
// scripted a fault at an exact point — the n-th call of a kind fails with an
// errno, sends or writes from the n-th on take only a few bytes, polls from
// the n-th on find nothing ready (a stalled peer), the clock jumps when the
// n-th call of a kind returns. Its clock is the real one plus whatever the
// faults added, and sleeping on it only moves it, so a test of a 30-second
// deadline takes no time. Counts calls of every kind.
// Thread-safe (one mutex), so a server or peer thread may share it.
#pragma once

#include <array>
#include <cstddef>
#include <mutex>
#include <optional>

#include "common/os.h"

namespace lockstep::testing {

class FaultyOs final : public Os {
 public:
  enum class Call { send, recv, poll, connect, accept, open, write, fsync, rename, allocate };
  static constexpr std::size_t kCalls = 10;

  // The n-th call (1-based) of `call` fails with `error` and does nothing.
  void fail(Call call, int nth, int error);
  // Every call of `call` from the n-th on fails with `error`.
  void fail_from(Call call, int nth, int error);
  // Sends and writes from the n-th on take at most `max_bytes` each.
  void shorten(Call call, int nth, std::size_t max_bytes);
  // Polls from the n-th on: nothing becomes ready (a peer that stopped
  // answering), and the clock moves on by the time each poll was given.
  void stall_polls_from(int nth);
  // When the n-th call of `call` returns, the clock is `jump` later.
  void jump_clock_after(Call call, int nth, Duration jump);

  int calls(Call call) const;
  // How far this clock is ahead of the real one.
  Duration ahead() const;

  Clock::time_point now() override;
  Clock::time_point coarse_now() override;
  void sleep_for(Duration d) override;
  ssize_t send(int fd, const void* data, std::size_t len, int flags) override;
  ssize_t recv(int fd, void* data, std::size_t len, int flags) override;
  int poll(pollfd* fds, nfds_t count, int timeout_ms) override;
  int connect(int fd, const sockaddr* addr, socklen_t len) override;
  int accept(int listener, int flags) override;
  int open(const char* path, int flags, mode_t mode) override;
  ssize_t write(int fd, const void* data, std::size_t len) override;
  int fsync(int fd) override;
  int rename(const char* from, const char* to) override;
  int allocate(int fd, off_t len) override;

 private:
  struct Script {
    int calls = 0;
    std::optional<int> fail_nth, fail_from_nth;
    int error = 0;
    std::optional<int> shorten_from;
    std::size_t max_bytes = 0;
    std::optional<int> jump_after;
    Duration jump{0};
  };
  // Counts a call; returns the errno it must fail with (0: make it), and
  // the most bytes it may move.
  int begin(Call call, std::size_t* max_bytes = nullptr);
  Script& script(Call call) { return scripts_[static_cast<std::size_t>(call)]; }
  // After the call: applies a scheduled clock jump.
  void end(Call call);
  template <typename Real>
  auto faulted(Call call, std::size_t* max_bytes, Real real);

  mutable std::mutex mutex_;
  std::array<Script, kCalls> scripts_{};
  std::optional<int> stall_from_;
  Duration ahead_{0};
};

}  // namespace lockstep::testing
