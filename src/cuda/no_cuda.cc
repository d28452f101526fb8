// The CUDA side of a lockstep built without the CUDA toolkit: any operation
// on CUDA memory says so, and how to get it.
#include <fmt/format.h>

#include "comm/device_memory.h"
#include "ddp/bucket_memory.h"

namespace lockstep {

namespace {

[[noreturn]] void refuse(const char* what) {
  throw ConfigError(fmt::format(
      "{} on CUDA memory, but this lockstep was built without CUDA: CMake did not find the CUDA toolkit. "
      "Install it (nvcc and the runtime; NCCL for the nccl backend), or point CMake at it with "
      "-DCUDAToolkit_ROOT=/usr/local/cuda, and rebuild (docs/gpu.md)",
      what));
}

}  // namespace

bool built_with_cuda() { return false; }

std::unique_ptr<DeviceRuntime> make_device_runtime(const Config&, const Logger&) { refuse("this operation is"); }

namespace detail {

std::unique_ptr<BucketMemory> cuda_bucket_memory(Device) { refuse("the model's gradients are"); }

}  // namespace detail

}  // namespace lockstep
