// CUDA memory for `lockstep bench --device cuda`: buffers on the GPU, the
// copies that fill and check them, and the rate cudaMemcpy itself reaches
// on pinned memory (what staging is measured against). Built against the
// CUDA runtime where CMake found the toolkit (device_memory_cuda.cc), else
// device_memory_none.cc, which says how to get it.
// Not thread-safe: one per rank.
#pragma once

#include <cstddef>
#include <memory>

#include "lockstep/types.h"

namespace lockstep::cli {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual Device device() const = 0;
  // Device memory of `bytes` (at least 1); give it back with release().
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* memory) = 0;
  virtual void upload(void* device, const void* host, std::size_t bytes) = 0;
  virtual void download(void* host, const void* device, std::size_t bytes) = 0;
  // cudaMemcpy's rate between pinned host memory and the device, in GB/s,
  // each way alone, and each way while the other runs too (two streams):
  // the medians of several copies of `bytes`. Staging copies a chunk out
  // while the one before it copies back in, so both_ways is its bound.
  struct CopyRates {
    double to_device = 0;
    double to_host = 0;
    double both_ways = 0;  // each direction's rate, both at once
  };
  virtual CopyRates pinned_copy_rates(std::size_t bytes) = 0;
};

// cuda:(local_rank % the devices this process sees). Throws ConfigError
// when lockstep was built without CUDA or there is no device.
std::unique_ptr<DeviceMemory> open_device_memory(int local_rank);

}  // namespace lockstep::cli
