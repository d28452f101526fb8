// The CUDA side of a lockstep built without the CUDA toolkit: any operation
// on CUDA memory says so, and how to get it.
#include "comm/device_memory.h"

namespace lockstep {

bool built_with_cuda() { return false; }

std::unique_ptr<DeviceRuntime> make_device_runtime(const Config&, const Logger&) {
  throw ConfigError(
      "this operation is on CUDA memory, but this lockstep was built without CUDA: CMake did not find the CUDA "
      "toolkit. Install it (nvcc and the runtime; NCCL for the nccl backend), or point CMake at it with "
      "-DCUDAToolkit_ROOT=/usr/local/cuda, and rebuild (docs/gpu.md)");
}

}  // namespace lockstep
