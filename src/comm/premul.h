// PREMUL_SUM's first half: each rank's input multiplied by a factor before
// the sum (the front end does this, then runs an ordinary sum). Floating
// types only; 16-bit values are multiplied in fp32 and rounded once, as
// PyTorch does for half and bfloat16 tensors. Stateless; thread-safe.
#pragma once

#include <cstddef>

#include "lockstep/types.h"

namespace lockstep {

// dst[i] = src[i] * factor for `count` elements (dst may be src).
void premultiply(void* dst, const void* src, std::size_t count, DType dtype, double factor);

}  // namespace lockstep
