// current_stream() for a libtorch without CUDA, where no tensor is on a
// GPU. See cuda_stream.h.
#include <fmt/format.h>

#include "lockstep/error.h"
#include "cuda_stream.h"

namespace lockstep::torch {

void* current_stream(const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  throw InvalidArgument(fmt::format(
      "a tensor is on {}, but lockstep's libtorch frontend was built against a libtorch without CUDA; build it "
      "against PyTorch's libtorch with CUDA (scripts/gpu-check.sh, docs/gpu.md)",
      device.str()));
}

}  // namespace lockstep::torch
