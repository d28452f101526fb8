// fp16 (IEEE binary16) and bfloat16 conversion. float -> 16 bit rounds to
// nearest, ties to even; Inf stays Inf; NaN stays NaN (made quiet, payload's top
// bits kept); overflow rounds to Inf as IEEE says. Pure functions; thread-safe.
#pragma once

#include <bit>
#include <cstdint>

namespace lockstep {

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    if (mantissa == 0) return std::bit_cast<float>(sign | 0x7f800000u);          // Inf
    return std::bit_cast<float>(sign | 0x7fc00000u | (mantissa << 13));           // NaN, made quiet
  }
  if (exponent == 0) {
    // Zero or subnormal: the value is mantissa * 2^-24, exact in a float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_half(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // Inf or NaN
    if (magnitude == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 is halfway between the largest half (65504) and the next power of
  // two; ties go to the even neighbour, which is Inf.
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is a multiple of
    // 2^-24. Adding 0.5 puts the float's last mantissa bit at 2^-24, so the
    // FPU's own round-to-nearest-even does the rounding.
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to
  // nearest even; a carry out of the mantissa correctly bumps the exponent.
  const std::uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xc8000fffu + odd;
  return static_cast<std::uint16_t>(sign | (magnitude >> 13));
}

inline float bf16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  const std::uint32_t odd = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + odd) >> 16);
}

}  // namespace lockstep
