// The part of lockstep's libtorch frontend the backend stands on (its
// torch.distributed functions and the tensor views they use), compiled into
// the extension against the PyTorch it runs with, rather than linked from a
// build against another libtorch. The CUDA build (LOCKSTEP_WITH_CUDA=1, see
// setup.py) takes CUDA tensors on their current streams; the CPU build
// refuses them, naming that variable (cuda_support.h). A source here that
// calls a function of another src/torch file needs that file here too:
// checked by tests/lint/python_unit_sources.sh.
#include "torch/distributed.cc"
#include "torch/receivers.cc"
#include "torch/written_across.cc"
#include "torch/tensors.cc"

#if LOCKSTEP_TORCH_WITH_CUDA
#include "torch/cuda_stream_torch.cc"
#else
#include "cuda_support.h"

namespace lockstep::torch {

// current_stream() of the CPU build (see torch/cuda_stream.h): no stream
// to hand lockstep, so a CUDA tensor is refused with the way to build one.
void* current_stream(const c10::Device& device) {
  if (device.is_cpu()) return nullptr;
  throw InvalidArgument(lockstep_torch::without_cuda_message(device.str()));
}

}  // namespace lockstep::torch
#endif
