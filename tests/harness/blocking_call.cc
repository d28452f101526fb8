// BlockingCall; see blocking_call.h.
#include "harness/blocking_call.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <fmt/format.h>

namespace lockstep::testing {
namespace {

// The scheduler state of thread `tid` of this process ('R', 'S', 'D', ...).
char thread_state(pid_t tid) {
  std::ifstream stat(fmt::format("/proc/self/task/{}/stat", tid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // "tid (comm) S ...": the command may hold spaces and parentheses, the
  // state follows the last ')'.
  const auto close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() ? '?' : text[close + 2];
}

}  // namespace

BlockingCall::BlockingCall(std::function<void()> call)
    : thread_([this, call = std::move(call)] {
        tid_ = static_cast<pid_t>(::syscall(SYS_gettid));
        try {
          call();
        } catch (...) {
          error_ = std::current_exception();
        }
        returned_ = true;
      }) {}

BlockingCall::~BlockingCall() {
  if (thread_.joinable()) thread_.join();
}

bool BlockingCall::blocked(Duration timeout) {
  // Polled: the kernel offers no event for "this thread went to sleep".
  for (const Deadline deadline = Deadline::after(timeout); !deadline.expired();) {
    if (returned_) return false;
    const pid_t tid = tid_;
    if (tid != 0) {
      const char state = thread_state(tid);
      if ((state == 'S' || state == 'D') && !returned_) return true;
    }
    std::this_thread::yield();
  }
  return false;
}

void BlockingCall::join() {
  thread_.join();
  if (error_) std::rethrow_exception(error_);
}

}  // namespace lockstep::testing
