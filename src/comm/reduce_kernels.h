// Elementwise reduction kernels shared by all backends.
//
// Determinism: every kernel applies its operands in a fixed order, so ranks
// that reduce the same inputs in the same order get bitwise-identical results.
// `min`/`max` propagate NaN; integer `sum`/`prod` wrap (two's complement);
// 16-bit floats are computed in fp32 and rounded once per kernel call.
// For `avg`, reduce_into sums and callers finish with divide_by; reduce_many
// divides by its number of sources itself, before rounding (16-bit types are
// still rounded once).
//
// Pure functions over caller memory; thread-safe.
#pragma once

#include <cstddef>

#include "lockstep/types.h"

namespace lockstep {

// The type partial results are kept in: fp32 for f16/bf16, else the type itself.
DType accumulation_dtype(DType dtype);

// dst[i] = op(dst[i], src[i]); with src_first, op(src[i], dst[i]). Both in
// `dtype` (for 16-bit types each element is widened, combined and rounded).
void reduce_into(void* dst, const void* src, std::size_t count, DType dtype, ReduceOp op, bool src_first = false);

// dst[i] = op(...op(op(srcs[0][i], srcs[1][i]), srcs[2][i])...), one pass over
// the inputs, in cache-sized blocks; 16-bit types accumulate in fp32 and are
// rounded once; avg divides the sum by nsrcs. dst may alias one of the
// sources. nsrcs >= 1.
void reduce_many(void* dst, const void* const* srcs, int nsrcs, std::size_t count, DType dtype, ReduceOp op);

// data[i] /= divisor (integer division truncates). For avg.
void divide_by(void* data, std::size_t count, DType dtype, int divisor);

// 16-bit <-> fp32 conversion for accumulation buffers; dtype is f16 or bf16.
void widen_to_f32(const void* src, float* dst, std::size_t count, DType dtype);
void narrow_from_f32(const float* src, void* dst, std::size_t count, DType dtype);

}  // namespace lockstep
