// See device_scratch.h.
#include "comm/nccl/device_scratch.h"

#include <fmt/format.h>

#include "device/cuda_runtime.h"

namespace lockstep::nccl {

DeviceScratch::~DeviceScratch() {
  if (data_ != nullptr) cudaFree(data_);
}

void* DeviceScratch::reserve(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= bytes_) return data_;
  if (data_ != nullptr) cuda::check(cudaFree(data_), "freeing the nccl backend's device scratch memory");
  data_ = nullptr;
  bytes_ = 0;
  cuda::check(cudaMalloc(&data_, bytes),
              fmt::format("allocating {} bytes of device memory to copy host buffers through", bytes));
  bytes_ = bytes;
  return data_;
}

}  // namespace lockstep::nccl
