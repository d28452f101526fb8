// Reduction kernels; see reduce_kernels.h. Loops are written so the compiler
// vectorises them (restrict pointers, no calls in the loop body); on x86-64
// the hot ones are compiled for AVX2 as well and picked at run time
// (LOCKSTEP_MULTIVERSION), with the baseline build as the fallback, so the
// same binary runs on any x86-64 and the code builds unchanged elsewhere.
// Stateless; thread-safe.
#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/enforce.h"
#include "common/format.h"
#include "comm/half_simd.h"
#include "common/half.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define LOCKSTEP_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define LOCKSTEP_MULTIVERSION
#endif

namespace lockstep {
namespace {

// Elementwise operators. Integer sum/prod go through the unsigned type so
// overflow wraps instead of being undefined.
template <typename T>
struct Sum {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
template <typename T>
struct Prod {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      // unsigned char / short promote to int; multiply in a wide unsigned type.
      return static_cast<T>(static_cast<std::uint64_t>(static_cast<U>(a)) * static_cast<std::uint64_t>(static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};
// NaN-propagating: a NaN operand wins (the first one, if both are NaN).
template <typename T>
struct Min {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return b < a ? b : a;
  }
};
template <typename T>
struct Max {
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? b : a;
  }
};

template <typename T, typename Op>
LOCKSTEP_MULTIVERSION void combine(T* __restrict dst, const T* __restrict src, std::size_t n, bool src_first) {
  if (src_first) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = Op::apply(src[i], dst[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], src[i]);
  }
}

template <typename T, typename Op>
LOCKSTEP_MULTIVERSION void combine3(T* __restrict dst, const T* __restrict a, const T* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename T>
void dispatch_op(ReduceOp op, auto&& fn) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: return fn(Sum<T>{});  // its inputs were multiplied first
    case ReduceOp::prod: return fn(Prod<T>{});
    case ReduceOp::min: return fn(Min<T>{});
    case ReduceOp::max: return fn(Max<T>{});
  }
}

// Calls fn(T{}) with the native C++ type of a non-16-bit dtype.
void dispatch_native(DType dtype, auto&& fn) {
  switch (dtype) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::i32: return fn(std::int32_t{});
    case DType::i64: return fn(std::int64_t{});
    case DType::u8: return fn(std::uint8_t{});
    case DType::f16:
    case DType::bf16: break;
  }
  LOCKSTEP_ENFORCE(false, "dispatch_native called with {}", dtype);
}

bool is_16bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// Elements per block for fused and 16-bit kernels: 4 KiB of floats keeps the
// widened operands in L1.
constexpr std::size_t kBlock = 1024;

}  // namespace

// fp16 goes through half_simd.h (F16C where the CPU has it); bf16's shifts
// vectorise as they are.
LOCKSTEP_MULTIVERSION void widen_to_f32(const void* src, float* dst, std::size_t count, DType dtype) {
  const auto* s = static_cast<const std::uint16_t*>(src);
  if (dtype == DType::f16) {
    widen_half(s, dst, count);
  } else {
    for (std::size_t i = 0; i < count; ++i) dst[i] = bf16_to_float(s[i]);
  }
}

LOCKSTEP_MULTIVERSION void narrow_from_f32(const float* src, void* dst, std::size_t count, DType dtype) {
  auto* d = static_cast<std::uint16_t*>(dst);
  if (dtype == DType::f16) {
    narrow_half(src, d, count);
  } else {
    for (std::size_t i = 0; i < count; ++i) d[i] = float_to_bf16(src[i]);
  }
}

DType accumulation_dtype(DType dtype) { return is_16bit(dtype) ? DType::f32 : dtype; }

void reduce_into(void* dst, const void* src, std::size_t count, DType dtype, ReduceOp op, bool src_first) {
  if (count == 0) return;
  if (is_16bit(dtype)) {
    float a[kBlock], b[kBlock];
    auto* d = static_cast<std::uint16_t*>(dst);
    const auto* s = static_cast<const std::uint16_t*>(src);
    for (std::size_t i = 0; i < count; i += kBlock) {
      const std::size_t n = std::min(kBlock, count - i);
      widen_to_f32(d + i, a, n, dtype);
      widen_to_f32(s + i, b, n, dtype);
      dispatch_op<float>(op, [&](auto o) { combine<float, decltype(o)>(a, b, n, src_first); });
      narrow_from_f32(a, d + i, n, dtype);
    }
    return;
  }
  dispatch_native(dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_op<T>(op, [&](auto o) {
      combine<T, decltype(o)>(static_cast<T*>(dst), static_cast<const T*>(src), count, src_first);
    });
  });
}

void reduce_many(void* dst, const void* const* srcs, int nsrcs, std::size_t count, DType dtype, ReduceOp op) {
  LOCKSTEP_ENFORCE_GE(nsrcs, 1);
  if (count == 0) return;
  const std::size_t elem = dtype_size(dtype);
  const bool average = op == ReduceOp::avg && nsrcs > 1;
  if (is_16bit(dtype)) {
    float acc[kBlock], next[kBlock];
    for (std::size_t i = 0; i < count; i += kBlock) {
      const std::size_t n = std::min(kBlock, count - i);
      widen_to_f32(static_cast<const char*>(srcs[0]) + i * elem, acc, n, dtype);
      for (int s = 1; s < nsrcs; ++s) {
        widen_to_f32(static_cast<const char*>(srcs[s]) + i * elem, next, n, dtype);
        dispatch_op<float>(op, [&](auto o) { combine<float, decltype(o)>(acc, next, n, false); });
      }
      if (average)
        for (std::size_t j = 0; j < n; ++j) acc[j] /= static_cast<float>(nsrcs);
      narrow_from_f32(acc, static_cast<char*>(dst) + i * elem, n, dtype);
    }
    return;
  }
  dispatch_native(dtype, [&](auto t) {
    using T = decltype(t);
    dispatch_op<T>(op, [&](auto o) {
      using Op = decltype(o);
      if (nsrcs == 1) {
        if (dst != srcs[0]) std::memmove(dst, srcs[0], count * sizeof(T));
        return;
      }
      // When dst overlaps no source (the inline path, out-of-place
      // allreduce), fold straight into it block by block: no staging block,
      // no copy, one pass over memory.
      bool overlaps = false;
      for (int s = 0; s < nsrcs; ++s) {
        const auto* src = static_cast<const T*>(srcs[s]);
        overlaps |= src < static_cast<T*>(dst) + count && static_cast<T*>(dst) < src + count;
      }
      if (!overlaps) {
        for (std::size_t i = 0; i < count; i += kBlock) {
          const std::size_t n = std::min(kBlock, count - i);
          T* out = static_cast<T*>(dst) + i;
          combine3<T, Op>(out, static_cast<const T*>(srcs[0]) + i, static_cast<const T*>(srcs[1]) + i, n);
          for (int s = 2; s < nsrcs; ++s) combine<T, Op>(out, static_cast<const T*>(srcs[s]) + i, n, false);
          if (average) divide_by(out, n, dtype, nsrcs);
        }
        return;
      }
      // Block by block so each block of dst stays in cache while every
      // source is folded into it: one pass over memory in total.
      for (std::size_t i = 0; i < count; i += kBlock) {
        const std::size_t n = std::min(kBlock, count - i);
        T block[kBlock];
        combine3<T, Op>(block, static_cast<const T*>(srcs[0]) + i, static_cast<const T*>(srcs[1]) + i, n);
        for (int s = 2; s < nsrcs; ++s) combine<T, Op>(block, static_cast<const T*>(srcs[s]) + i, n, false);
        if (average) divide_by(block, n, dtype, nsrcs);
        std::memcpy(static_cast<T*>(dst) + i, block, n * sizeof(T));
      }
    });
  });
}

void divide_by(void* data, std::size_t count, DType dtype, int divisor) {
  if (count == 0 || divisor == 1) return;
  if (is_16bit(dtype)) {
    float block[kBlock];
    auto* d = static_cast<std::uint16_t*>(data);
    for (std::size_t i = 0; i < count; i += kBlock) {
      const std::size_t n = std::min(kBlock, count - i);
      widen_to_f32(d + i, block, n, dtype);
      for (std::size_t j = 0; j < n; ++j) block[j] /= static_cast<float>(divisor);
      narrow_from_f32(block, d + i, n, dtype);
    }
    return;
  }
  dispatch_native(dtype, [&](auto t) {
    using T = decltype(t);
    T* d = static_cast<T*>(data);
    if constexpr (std::is_integral_v<T>) {
      for (std::size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<std::int64_t>(d[i]) / divisor);
    } else {
      const T div = static_cast<T>(divisor);
      for (std::size_t i = 0; i < count; ++i) d[i] = d[i] / div;
    }
  });
}

}  // namespace lockstep
