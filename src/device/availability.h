// Whether this lockstep can use CUDA memory, and the error every operation
// on CUDA memory gives when it cannot. No CUDA type appears here, so every
// layer includes it the same with or without the CUDA toolkit.
// Thread-safe (no state).
#pragma once

#include <string_view>

#include "lockstep/error.h"

namespace lockstep {

// Whether this lockstep was built with the CUDA toolkit (CMake chose
// cuda_runtime.cc or no_cuda.cc).
bool built_with_cuda();

// The ConfigError of a lockstep built without CUDA: "<what_is> on CUDA
// memory", why it cannot be, and how to get CUDA. The fallbacks of the
// layers above (comm/staging, ddp/cuda) throw it.
ConfigError built_without_cuda(std::string_view what_is);

}  // namespace lockstep
