// The stream contract of one operation on CUDA memory (comm/device_memory.h):
// an event on the caller's stream when the operation is issued, which the
// group's stream waits for when the operation starts; an event on the
// group's stream when its device work is queued, which Work::wait() makes
// the caller's stream wait for.
// Thread-safety: see detail::StreamOrder.
#pragma once

#include "comm/device_memory.h"
#include "device/cuda_runtime.h"

namespace lockstep::cuda {

class CudaStreamOrder final : public detail::StreamOrder {
 public:
  // On the issuing thread: records where `caller` stands. `group` is the
  // group's stream on `device` (it outlives this order).
  CudaStreamOrder(Device device, cudaStream_t caller, cudaStream_t group);

  Device device() const override { return device_; }
  void* stream() const override { return group_; }
  void begin() override;
  void record_done() override;
  void caller_stream_waits() override;
  bool host_waits(Duration timeout) override;

 private:
  const Device device_;
  const cudaStream_t caller_;
  const cudaStream_t group_;
  Event issued_;  // on the caller's stream, at the call
  Event done_;    // on the group's stream, after the operation's device work
  bool recorded_done_ = false;
};

}  // namespace lockstep::cuda
