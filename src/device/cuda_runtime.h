// Small owners of CUDA runtime objects (device guard, stream, event, pinned
// host memory), and the checks that turn a CUDA error into a lockstep Error
// naming what was being done: the device layer, below comm, which the nccl
// backend, the staging backend and the Reducer's device buckets share. Every
// wait on the device polls, so it honours a deadline and a cancellation like
// every other wait in lockstep (a CUDA call that blocks cannot).
// Not thread-safe: each object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>

#include <cuda_runtime_api.h>

#include "common/clock.h"

namespace lockstep::cuda {

// Throws Error("<what>: CUDA error <name> (<description>)") unless `status` is cudaSuccess.
void check(cudaError_t status, std::string_view what);

// The number of CUDA devices this process sees; none is a ConfigError
// saying "<what_is> on CUDA memory" ("this operation is") and what to check.
int visible_devices(std::string_view what_is);

// Makes `device` current on this thread for its scope, and restores the one before.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// A stream of the current device that does not wait for the legacy default
// stream (the caller's work is ordered by events instead).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event of the current device, without timing (cheaper to record and wait on).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  // Whether the work before the last record() is done (true if never recorded).
  bool query() const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Page-locked host memory, so copies to and from the device run at the
// link's rate and asynchronously. Grows; never shrinks.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // At least `bytes`; the old contents are lost when it grows. The caller
  // makes sure no copy still uses it.
  std::byte* reserve(std::size_t bytes);

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Polls `event` until it completes (true); false when `deadline` passes or
// `cancelled()` (if given) says so first. The caller says which and why.
bool wait_for(const Event& event, Deadline deadline, const std::function<bool()>& cancelled);
// The same against a plain timeout; false when it passed first.
bool wait_for(const Event& event, Duration timeout);

}  // namespace lockstep::cuda
