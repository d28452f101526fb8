// Device memory the nccl backend owns: where host buffers are copied so
// NCCL can move them, and the word a barrier reduces. Grows; never shrinks.
// Not thread-safe: used by the thread that runs the group's operations, with
// the backend's device current, while no device work uses it.
#pragma once

#include <cstddef>

namespace lockstep::nccl {

class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  // At least `bytes` of device memory (at least one byte, so the pointer is
  // never null); the old contents are lost when it grows.
  void* reserve(std::size_t bytes);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace lockstep::nccl
