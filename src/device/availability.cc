// See availability.h.
#include "device/availability.h"

#include <fmt/format.h>

namespace lockstep {

ConfigError built_without_cuda(std::string_view what_is) {
  return ConfigError(fmt::format(
      "{} on CUDA memory, but this lockstep was built without CUDA: CMake did not find the CUDA toolkit. "
      "Install it (nvcc and the runtime; NCCL for the nccl backend), or point CMake at it with "
      "-DCUDAToolkit_ROOT=/usr/local/cuda, and rebuild (docs/gpu.md)",
      what_is));
}

}  // namespace lockstep
