// CUDA memory in the process group, as the front end sees it: no CUDA type
// appears here, so the front end and the host backends build the same with
// or without the CUDA toolkit. The CUDA side lives in src/comm/staging/,
// over the device layer's wrappers in src/device/ (built when CMake finds
// the toolkit; otherwise its factory says how to get it).
//
// The stream contract (PyTorch c10d's; docs/algorithms.md, "CUDA memory and
// streams"): an operation on CUDA memory runs after the work the caller
// queued on the buffers' stream before the call (an event recorded there,
// on the issuing thread), its own device work goes on the group's stream,
// and Work::wait() makes the caller's stream wait for it without blocking
// the host; Work::synchronize() blocks the host.
//
// Thread-safety: order_after runs on the issuing thread; a StreamOrder is
// then used by the thread that runs the operation, and by Work's waiters
// once the operation is done.
#pragma once

#include <memory>

#include "comm/backend.h"
#include "device/availability.h"

namespace lockstep {

namespace detail {

// The ordering of one operation on CUDA memory against its caller's stream.
class StreamOrder {
 public:
  virtual ~StreamOrder() = default;
  virtual Device device() const = 0;
  // The group's stream for this operation's device work (a cudaStream_t).
  virtual void* stream() const = 0;
  // Makes stream() wait for the work the caller queued before the call.
  // Called on the thread that runs the operation, before it queues device
  // work: not at the call, where the group's stream may still receive an
  // earlier operation's work, which would then wait for later caller work.
  virtual void begin() = 0;
  // The operation queued its last device work on stream(): remember that
  // point. Called on the thread that ran the operation.
  virtual void record_done() = 0;
  // Work::wait(): the caller's stream waits for that point; the host does not.
  virtual void caller_stream_waits() = 0;
  // Work::synchronize(): the host waits for it; false when `timeout` passed first.
  virtual bool host_waits(Duration timeout) = 0;
};

}  // namespace detail

// CUDA, for one group: created at the group's first operation on CUDA memory,
// so host-only programs never initialise CUDA.
class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  // On the issuing thread: records where `caller_stream` (a cudaStream_t on
  // `device`; null: the default stream) stands now.
  virtual std::shared_ptr<detail::StreamOrder> order_after(Device device, void* caller_stream) = 0;
  // Runs collectives on CUDA memory over `host`, a backend that moves host
  // memory only, by staging through pinned host memory (src/comm/staging/staged_backend.h).
  // Every call it gets carries an OpContext::streams; `host` (of which this
  // process is `rank`) outlives it.
  virtual std::unique_ptr<Backend> staged_over(Backend& host, int rank) = 0;
};

// The CUDA runtime of one group. Throws ConfigError when lockstep was built
// without CUDA, or when this process sees no CUDA device, naming the cause.
std::unique_ptr<DeviceRuntime> make_device_runtime(const Config& config, const Logger& log);

}  // namespace lockstep
