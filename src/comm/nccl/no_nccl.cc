// The nccl folder when lockstep is built without NCCL (the CUDA toolkit or
// NCCL not found, or LOCKSTEP_WITH_CUDA=OFF): the same entry point, saying
// how to get it. CMake compiles this file instead of the others; no #ifdef
// needed. Stateless; thread-safe.
#include <fmt/format.h>

#include "comm/backend.h"
#include "lockstep/error.h"

namespace lockstep {

std::unique_ptr<Backend> make_nccl_backend(const BackendContext& ctx) {
  throw ConfigError(fmt::format(
      "rank {}/{}: backend nccl is not built into this lockstep: CMake found {}; install the CUDA toolkit and NCCL "
      "(libnccl-dev), or point CMake at NCCL with -DLOCKSTEP_NCCL_INCLUDE_DIR=<dir of nccl.h> "
      "-DLOCKSTEP_NCCL_LIBRARY=<path of libnccl.so> (or NCCL_HOME), and rebuild; or choose backend auto, shm or tcp",
      ctx.rank, ctx.size, LOCKSTEP_NCCL_MISSING_BECAUSE));
}

}  // namespace lockstep
