// See half_simd.h.
#include "comm/half_simd.h"

#include "common/half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define LOCKSTEP_F16C 1
#endif

namespace lockstep {

void widen_half_scalar(const std::uint16_t* src, float* dst, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = half_to_float(src[i]);
}

void narrow_half_scalar(const float* src, std::uint16_t* dst, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dst[i] = float_to_half(src[i]);
}

#if LOCKSTEP_F16C

namespace {

__attribute__((target("avx,f16c"))) void widen_f16c(const std::uint16_t* src, float* dst, std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  widen_half_scalar(src + i, dst + i, count - i);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* src, std::uint16_t* dst, std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  narrow_half_scalar(src + i, dst + i, count - i);
}

}  // namespace

bool has_f16c() {
  // "avx" covers the OS saving the YMM registers; F16C is read from CPUID
  // itself (not every compiler knows the feature name "f16c").
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return yes;
}

void widen_half(const std::uint16_t* src, float* dst, std::size_t count) {
  if (has_f16c())
    widen_f16c(src, dst, count);
  else
    widen_half_scalar(src, dst, count);
}

void narrow_half(const float* src, std::uint16_t* dst, std::size_t count) {
  if (has_f16c())
    narrow_f16c(src, dst, count);
  else
    narrow_half_scalar(src, dst, count);
}

#else

bool has_f16c() { return false; }
void widen_half(const std::uint16_t* src, float* dst, std::size_t count) { widen_half_scalar(src, dst, count); }
void narrow_half(const float* src, std::uint16_t* dst, std::size_t count) { narrow_half_scalar(src, dst, count); }

#endif

}  // namespace lockstep
