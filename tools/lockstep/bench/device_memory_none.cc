// `lockstep bench --device cuda` in a lockstep built without CUDA.
#include "bench/device_memory.h"

#include "lockstep/error.h"

namespace lockstep::cli {

std::unique_ptr<DeviceMemory> open_device_memory(int) {
  throw ConfigError(
      "--device cuda: this lockstep was built without CUDA (CMake did not find the CUDA toolkit). Install it, or "
      "point CMake at it with -DCUDAToolkit_ROOT=/usr/local/cuda, and rebuild");
}

}  // namespace lockstep::cli
