// What the libtorch tests on CUDA share: skipping without a GPU, exact fp32
// on the device, and rank processes that each train on
// cuda:0. The ranks are processes, not threads: libtorch runs every backward
// on a device of a process on one thread, which thread ranks would share;
// and the parent never touches CUDA before forking them (a forked child
// cannot use a CUDA its parent started).
#pragma once

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <string>

#include "harness/launcher.h"  // TempDir
#include "lockstep/process_group.h"

#define SKIP_WITHOUT_CUDA()                                                                                   \
  do {                                                                                                        \
    if (!::torch::cuda::is_available())                                                                       \
      GTEST_SKIP() << "no CUDA device visible to libtorch (or a libtorch without CUDA): this test needs a GPU"; \
  } while (0)

namespace lockstep::testing {

// Exact fp32 convolutions and matrix products, so that the GPU differs
// from the CPU only in the order of its sums.
void exact_fp32();

// Runs body(rank, group) in `n` rank processes over `backend` that each use
// cuda:0, with TF32 off and one intra-op thread; a rank that fails, or does
// not finish within `deadline`, fails the test. False (with `why`) when the
// ranks' libtorch sees no CUDA device. `dir` holds the ranks' notes.
bool run_on_gpu(int n, const std::string& backend, const std::string& dir,
                const std::function<void(int rank, ProcessGroup& pg)>& body, std::string* why,
                std::chrono::seconds deadline);

}  // namespace lockstep::testing
