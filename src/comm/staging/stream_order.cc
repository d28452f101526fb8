// See stream_order.h.
#include "comm/staging/stream_order.h"

#include <fmt/format.h>

namespace lockstep::cuda {

CudaStreamOrder::CudaStreamOrder(Device device, cudaStream_t caller, cudaStream_t group)
    : device_(device), caller_(caller), group_(group) {
  // The guard is the caller's (DeviceRuntime::order_after): events belong to the current device.
  issued_.record(caller_);
}

void CudaStreamOrder::begin() {
  // Here, not at the call: the group's stream may still hold an earlier
  // operation's copies, which must not wait for work the caller queued after it.
  check(cudaStreamWaitEvent(group_, issued_.get(), 0), "ordering a collective after the caller's stream");
}

void CudaStreamOrder::record_done() {
  done_.record(group_);
  recorded_done_ = true;
}

void CudaStreamOrder::caller_stream_waits() {
  if (!recorded_done_) return;
  DeviceGuard guard(device_.index);
  check(cudaStreamWaitEvent(caller_, done_.get(), 0), "making the caller's stream wait for a collective");
}

bool CudaStreamOrder::host_waits(Duration timeout) {
  if (!recorded_done_) return true;
  DeviceGuard guard(device_.index);
  return wait_for(done_, timeout);
}

}  // namespace lockstep::cuda
