// One blocking call on its own thread, so a test can see that the call is
// blocked inside (its thread asleep in the kernel before the call returned)
// before doing what should release it, instead of sleeping and hoping the
// call has started. Thread-safety: drive a BlockingCall from one thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <exception>
#include <functional>
#include <thread>

#include "common/clock.h"

namespace lockstep::testing {

class BlockingCall {
 public:
  explicit BlockingCall(std::function<void()> call);
  ~BlockingCall();  // joins: the call must be bounded by its own deadline
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

  // True once the call's thread sleeps in the kernel (state S or D in
  // /proc) while the call has not returned; false if the call returned
  // first or `timeout` passed.
  bool blocked(Duration timeout = std::chrono::seconds(10));
  bool returned() const { return returned_.load(); }
  // Waits for the call to return and rethrows what it threw.
  void join();

 private:
  std::atomic<pid_t> tid_{0};
  std::atomic<bool> returned_{false};
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace lockstep::testing
