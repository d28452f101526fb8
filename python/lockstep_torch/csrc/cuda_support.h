// Whether this build of the extension takes CUDA tensors (setup.py's
// LOCKSTEP_WITH_CUDA), and what the CPU build says when it gets one.
// Stateless; thread-safe.
#pragma once

#include <string>

namespace lockstep_torch {

inline constexpr bool kWithCuda = LOCKSTEP_TORCH_WITH_CUDA != 0;

// The refusal of a tensor on `device` (e.g. "cuda:0") by the CPU build.
std::string without_cuda_message(const std::string& device);

}  // namespace lockstep_torch
