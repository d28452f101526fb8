// fp16 <-> fp32 conversion of whole arrays with the x86 F16C instructions
// (8 values an instruction), where the CPU has them; elsewhere the scalar
// conversions of common/half.h. The scalar ones branch on every value and
// do not vectorise: a 2-rank all-reduce of fp16 ran at a fifth of bf16's
// rate with them. F16C rounds to nearest even and quiets NaNs keeping the
// payload's top bits, as half.h does, so both give the same bits
// (tests/comm/reduce_kernels_test.cc compares them on every half and on
// floats across the whole range).
// Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep {

// Whether this CPU converts with F16C (checked once).
bool has_f16c();
// dst[i] = half_to_float(src[i]), 8 at a time where the CPU can.
void widen_half(const std::uint16_t* src, float* dst, std::size_t count);
// dst[i] = float_to_half(src[i]), 8 at a time where the CPU can.
void narrow_half(const float* src, std::uint16_t* dst, std::size_t count);
// The scalar loops alone, for comparison.
void widen_half_scalar(const std::uint16_t* src, float* dst, std::size_t count);
void narrow_half_scalar(const float* src, std::uint16_t* dst, std::size_t count);

}  // namespace lockstep
