// The frontend's one contact with libtorch's CUDA API: the stream libtorch
// queues work on for a device. lockstep orders its copies and collectives
// on that stream, as PyTorch's c10d does, so a step never waits on the
// host. Built from cuda_stream_torch.cc where libtorch has CUDA, else from
// cuda_stream_none.cc (where no tensor can be on a GPU). Thread-safe:
// libtorch's current stream is per thread.
#pragma once

#include <c10/core/Device.h>

namespace lockstep::torch {

// The current stream of `device` on this thread, as a cudaStream_t; null
// for a CPU device. Throws InvalidArgument for other kinds of device.
void* current_stream(const c10::Device& device);

}  // namespace lockstep::torch
