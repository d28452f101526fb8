// current_stream() for a libtorch built with CUDA. See cuda_stream.h.
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>

#include "lockstep/error.h"
#include "cuda_stream.h"

namespace lockstep::torch {

void* current_stream(const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  if (!device.is_cuda())
    throw InvalidArgument(fmt::format("lockstep takes CPU and CUDA tensors, not tensors on {}", device.str()));
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

}  // namespace lockstep::torch
