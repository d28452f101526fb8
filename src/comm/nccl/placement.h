// Where one operation's buffers are on the device, and its end. CUDA
// memory (op.streams set) is used where it is, on the group's stream for
// the operation. Host memory (the front end's own small collectives: the
// DETAIL fingerprint check, all_to_all count agreement, object collectives)
// is copied into the backend's device scratch on the backend's own stream,
// and the results copied back once NCCL is done.
//
// On CUDA memory, where the engine lets it (OpContext::defer), finish()
// leaves a completion that polls the device instead of waiting, so the
// next operation is queued on the stream at once: nothing the backend owns
// is in use by then. On host memory finish() returns only when the device
// work is done (polled, with the operation's deadline), and its work is
// queued after every deferred operation's (its stream waits for the last).
//
// Not thread-safe: one Placement per operation, on the thread running it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/nccl/communicator.h"
#include "comm/nccl/device_scratch.h"
#include "device/cuda_runtime.h"

namespace lockstep::nccl {

// What an operation borrows from its backend.
struct PlacementResources {
  int device = 0;
  cudaStream_t host_stream = nullptr;  // host-memory operations run here
  DeviceScratch* input = nullptr;
  DeviceScratch* output = nullptr;
  cuda::Event* done = nullptr;
  Communicator* comm = nullptr;
  // The end of the last deferred operation, which host-memory operations
  // are ordered after; null until one is deferred.
  std::shared_ptr<cuda::Event>* last_deferred = nullptr;
};

class Placement {
 public:
  // InvalidArgument when the operation's CUDA memory is on another device
  // than the backend's.
  Placement(const PlacementResources& resources, const OpContext& op);

  cudaStream_t stream() const { return stream_; }
  bool on_host() const { return op_.streams == nullptr; }

  // The device address NCCL reads `b` from (host memory: copied to scratch).
  const void* input(ConstBuffer b);
  // The device address NCCL writes `b` at. Host memory: scratch, filled
  // with `b` first when `copy_in` (in-place operations), copied back to
  // `b` by finish() when `copy_back`.
  void* output(Buffer b, bool copy_in, bool copy_back = true);

  // Waits for the operation's device work (and for host memory the copies
  // back), or on CUDA memory leaves its completion to the engine. `what`
  // says what the operation was doing, for messages.
  void finish(std::string_view what);

 private:
  void check_device(Device device, const char* name) const;
  void wait(std::string_view what);

  PlacementResources resources_;
  const OpContext& op_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::pair<Buffer, const void*>> copy_back_;  // host buffer, its scratch
};

// `base` advanced by `elements` of `dtype`.
inline void* at(void* base, std::size_t elements, DType dtype) {
  return static_cast<std::byte*>(base) + elements * dtype_size(dtype);
}
inline const void* at(const void* base, std::size_t elements, DType dtype) {
  return static_cast<const std::byte*>(base) + elements * dtype_size(dtype);
}

}  // namespace lockstep::nccl
