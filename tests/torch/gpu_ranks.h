// What the libtorch tests on CUDA share: skipping without a GPU, exact fp32
// on the device, and rank processes that each train on
// cuda:0. The ranks are processes, not threads: libtorch runs every backward
// on a device of a process on one thread, which thread ranks would share.
// The test process itself never touches CUDA, not even to ask for the
// device count (torch::cuda::is_available, torch::manual_seed): a forked
// child cannot use a CUDA its parent started, and every later test of the
// same process forks ranks.
#pragma once

#include <torch/cuda.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>

#include "harness/launcher.h"  // TempDir
#include "lockstep/process_group.h"

// Skips a test on a machine without an NVIDIA device node, without starting
// CUDA in the test process (see above).
#define SKIP_WITHOUT_GPU_DEVICE()                                                                             \
  do {                                                                                                        \
    if (access("/dev/nvidiactl", F_OK) != 0) GTEST_SKIP() << "no CUDA device: /dev/nvidiactl is missing";    \
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

// Runs `body` in one child process that uses cuda:0 (with TF32 off), so
// that the test process never starts CUDA; an exception from `body` fails
// the test with its message. False (with `why`) when libtorch sees no CUDA
// device there. `dir` holds the child's note.
bool run_in_gpu_process(const std::string& dir, const std::function<void()>& body, std::string* why);

// For run_in_gpu_process: `action` must throw lockstep::InvalidArgument
// whose message holds every one of `phrases`; otherwise throws
// std::runtime_error saying what happened instead.
void expect_invalid_argument(const std::function<void()>& action, const std::vector<std::string>& phrases);

}  // namespace lockstep::testing
