// What the c10d::Backend interface of each PyTorch release the package
// builds against offers, in one place: the package builds against 2.4 (the
// oldest tested) up to the newest. Thread-safety: macros only.
#pragma once

#include <torch/version.h>

#define LOCKSTEP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// Backend::supportsCoalescing(), shutdown() and abort() are virtual in the
// releases from 2.11 on (and absent from 2.4, where batch_isend_irecv
// coalesces through startCoalescing alone and destroy_process_group only
// drops the reference). Releases in between are built without the keyword:
// where the base has the function, the same signature still overrides it.
#if LOCKSTEP_TORCH_AT_LEAST(2, 11)
#define LOCKSTEP_OVERRIDE_SINCE_2_11 override
#else
#define LOCKSTEP_OVERRIDE_SINCE_2_11
#endif
