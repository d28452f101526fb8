// The part of lockstep's libtorch frontend the backend stands on (its
// torch.distributed functions and the tensor views they use), compiled into
// the extension against the PyTorch it runs with, rather than linked from a
// build against another libtorch. CPU tensors only: no CUDA streams.
#include "torch/distributed.cc"
#include "torch/tensors.cc"
#include "torch/cuda_stream_none.cc"
