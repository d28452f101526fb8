// version_text; see version.h. What the library knows is asked at run time:
// the backend table (comm/backend_registry.h) and whether it was built with
// CUDA (device/availability.h). The rest CMake passes to this file alone
// (tools/lockstep/CMakeLists.txt): LOCKSTEP_VERSION, LOCKSTEP_BUILD_TORCH
// (the libtorch the build found, which the CLI itself does not link, or
// "none") and LOCKSTEP_BUILD_MPI / LOCKSTEP_BUILD_NCCL, because the table
// lists mpi and nccl in every build: without MPI or NCCL their factories
// are stand-ins that say how to get them.
#include "version.h"

#include <string_view>

#include <fmt/format.h>

#include "comm/backend_registry.h"
#include "device/availability.h"

namespace lockstep::cli {
namespace {

// Whether backend `name` of the table is built into this lockstep, rather
// than a stand-in that says how to get it.
bool backend_built(std::string_view name) {
  if (name == "mpi") return LOCKSTEP_BUILD_MPI;
  if (name == "nccl") return LOCKSTEP_BUILD_NCCL;
  return true;  // tcp, shm, hier: in every build
}

std::string torch_line() {
  const std::string_view found = LOCKSTEP_BUILD_TORCH;
  if (found == "none") return "libtorch: none (the build found none; the libtorch frontend is not built)";
  return fmt::format("libtorch: {} (the build found it; the libtorch frontend is built against it)", found);
}

}  // namespace

std::string version_text() {
  std::string built;
  std::string not_built;
  for (const auto& backend : registered_backends()) {
    std::string& list = backend_built(backend.name) ? built : not_built;
    list += fmt::format("{}{}", list.empty() ? "" : ", ", backend.name);
  }
  return fmt::format("lockstep {}\n{}\nbackends: {}{}\nCUDA memory: {}", LOCKSTEP_VERSION, torch_line(), built,
                     not_built.empty() ? "" : fmt::format(" (not built: {})", not_built),
                     built_with_cuda() ? "yes" : "no (built without the CUDA toolkit)");
}

}  // namespace lockstep::cli
