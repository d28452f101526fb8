// See cuda_support.h.
#include "cuda_support.h"

namespace lockstep_torch {

std::string without_cuda_message(const std::string& device) {
  return "a tensor is on " + device +
         ", but this lockstep_torch was built for CPU tensors only; rebuild it with CUDA: "
         "LOCKSTEP_WITH_CUDA=1 pip install --no-build-isolation ./python (docs/python.md, \"CUDA tensors\"), or "
         "keep NCCL for the GPU tensors: init_process_group(backend=\"cpu:lockstep,cuda:nccl\")";
}

}  // namespace lockstep_torch
