// Reduction kernels: every dtype and op against the reference, NaN
// propagation, integer wrap-around, 16-bit accumulation in fp32, and the
// vector fp16 conversions against the scalar ones, bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "comm/half_simd.h"
#include "comm/reduce_kernels.h"
#include "common/half.h"
#include "reference.h"

namespace lockstep {
namespace {

using testing::compare_elements;
using testing::make_input;
using testing::store_expected;

TEST(ReduceKernels, ReduceManyMatchesTheReferenceForEveryDTypeAndOp) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (int n : {1, 2, 3, 8}) {
        const std::size_t count = 3001;  // several blocks and a ragged tail
        std::vector<std::vector<std::byte>> inputs;
        std::vector<const void*> srcs;
        for (int r = 0; r < n; ++r) inputs.push_back(make_input(r, count, dtype, op));
        for (auto& in : inputs) srcs.push_back(in.data());
        std::vector<std::byte> got(count * dtype_size(dtype)), want(count * dtype_size(dtype));
        reduce_many(got.data(), srcs.data(), n, count, dtype, op);  // avg divides by n itself
        for (std::size_t i = 0; i < count; ++i) store_expected(want.data(), dtype, i, n, op);
        EXPECT_EQ(compare_elements(got.data(), want.data(), count, dtype), "")
            << dtype << " " << op << " over " << n << " inputs";
      }
    }
  }
}

// The reference fills its buffers by copying one period of values along
// (reference.h): the copies must hold what converting each element would.
TEST(ReferenceValues, PeriodicFillsEqualConvertingEveryElement) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (std::size_t count : {0, 1, 32, 33, 34, 1000, 4099}) {
        std::vector<std::byte> input(count * dtype_size(dtype) + 1), want(count * dtype_size(dtype) + 1);
        for (std::size_t i = 0; i < count; ++i) {
          testing::store_value(input.data(), dtype, i, testing::input_value(3, i, op));
          testing::store_expected_at(want.data(), dtype, i, 5 * count + i, 4, op);
        }
        EXPECT_EQ(make_input(3, count, dtype, op), input) << dtype << " " << op << " x " << count;
        EXPECT_EQ(testing::expected_results(dtype, count, 5 * count, 4, op), want) << dtype << " " << op << " x " << count;
      }
    }
  }
}

TEST(ReduceKernels, ReduceIntoMatchesReduceMany) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (op == ReduceOp::avg) continue;  // reduce_into leaves the division to its caller
      const std::size_t count = 1500;
      auto a = make_input(0, count, dtype, op);
      auto b = make_input(1, count, dtype, op);
      std::vector<std::byte> fused(a.size());
      const void* srcs[] = {a.data(), b.data()};
      reduce_many(fused.data(), srcs, 2, count, dtype, op);
      reduce_into(a.data(), b.data(), count, dtype, op);
      EXPECT_EQ(compare_elements(a.data(), fused.data(), count, dtype), "") << dtype << " " << op;
    }
  }
}

TEST(ReduceKernels, ReduceManyAveragesHalvesBeforeRoundingOnce) {
  // avg of 16-bit values: sum and divide in fp32, then round once.
  const std::uint16_t a[] = {float_to_half(1.0f + 3 * 0x1p-10f)}, b[] = {float_to_half(1.0f)};
  const void* srcs[] = {a, b};
  std::uint16_t out[1];
  reduce_many(out, srcs, 2, 1, DType::f16, ReduceOp::avg);
  const float exact = (half_to_float(a[0]) + half_to_float(b[0])) / 2.0f;
  EXPECT_EQ(out[0], float_to_half(exact));
}

TEST(ReduceKernels, MinAndMaxPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float a[] = {1, nan, 3, nan};
  const float b[] = {nan, 2, -1, 0};
  float c[4];
  std::copy(a, a + 4, c);
  reduce_into(a, b, 4, DType::f32, ReduceOp::min);
  reduce_into(c, b, 4, DType::f32, ReduceOp::max);
  EXPECT_TRUE(std::isnan(a[0]) && std::isnan(a[1]) && std::isnan(a[3]));
  EXPECT_EQ(a[2], -1);
  EXPECT_TRUE(std::isnan(c[0]) && std::isnan(c[1]));
  EXPECT_EQ(c[2], 3);
}

TEST(ReduceKernels, IntegerSumsWrapInsteadOfOverflowing) {
  std::int32_t a[] = {std::numeric_limits<std::int32_t>::max()};
  const std::int32_t b[] = {1};
  reduce_into(a, b, 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(a[0], std::numeric_limits<std::int32_t>::min());
  std::uint8_t x[] = {200};
  const std::uint8_t y[] = {100};
  reduce_into(x, y, 1, DType::u8, ReduceOp::sum);
  EXPECT_EQ(x[0], 44);
}

TEST(ReduceKernels, HalfInputsAreAccumulatedInFloatAndRoundedOnce) {
  // 1 + 2^-11 + 2^-11: rounding after each addition gives 1 (each sum is a
  // tie that goes to even); accumulating in fp32 and rounding once gives
  // 1 + 2^-10.
  const std::uint16_t one = float_to_half(1.0f), tiny = float_to_half(0x1p-11f);
  const std::uint16_t a[] = {one}, b[] = {tiny}, c[] = {tiny};
  const void* srcs[] = {a, b, c};
  std::uint16_t out[1];
  reduce_many(out, srcs, 3, 1, DType::f16, ReduceOp::sum);
  EXPECT_EQ(half_to_float(out[0]), 1.0f + 0x1p-10f);
}

TEST(ReduceKernels, SourceFirstOrderIsHonoured) {
  // The order of operands matters for which NaN payload survives; check the
  // kernel really swaps them.
  const float nan_a = std::bit_cast<float>(0x7fc00001u), nan_b = std::bit_cast<float>(0x7fc00002u);
  float dst[] = {nan_a};
  const float src[] = {nan_b};
  reduce_into(dst, src, 1, DType::f32, ReduceOp::max, /*src_first=*/true);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(dst[0]), 0x7fc00002u);
  dst[0] = nan_a;
  reduce_into(dst, src, 1, DType::f32, ReduceOp::max, /*src_first=*/false);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(dst[0]), 0x7fc00001u);
}

TEST(ReduceKernels, AccumulationTypes) {
  EXPECT_EQ(accumulation_dtype(DType::f16), DType::f32);
  EXPECT_EQ(accumulation_dtype(DType::bf16), DType::f32);
  EXPECT_EQ(accumulation_dtype(DType::i64), DType::i64);
}

// The vector conversions (F16C) must give the scalar ones' bits: every
// half, and floats spread over the whole range plus the edges (ties,
// subnormal results, the overflow threshold, NaN payloads). Counts that are
// not multiples of 8 cover the scalar tails.
TEST(HalfSimd, WidensEveryHalfAsTheScalarConversionDoes) {
  std::vector<std::uint16_t> halves(65536 + 5);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i);
  std::vector<float> simd(halves.size()), scalar(halves.size());
  widen_half(halves.data(), simd.data(), halves.size());
  widen_half_scalar(halves.data(), scalar.data(), halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(simd[i]), std::bit_cast<std::uint32_t>(scalar[i])) << "half 0x" << std::hex << halves[i];
  RecordProperty("f16c", has_f16c() ? "yes" : "no (both sides scalar)");
}

TEST(HalfSimd, NarrowsFloatsAcrossTheRangeAsTheScalarConversionDoes) {
  std::vector<float> floats;
  // Every 4093rd bit pattern (a prime stride: every exponent, mixed low bits).
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 4093)
    floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(bits)));
  for (const float edge : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f,
                           0x1.8p-25f, 0x1p-26f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1.ffep-15f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc12345u)})
    floats.push_back(edge);
  std::vector<std::uint16_t> simd(floats.size()), scalar(floats.size());
  narrow_half(floats.data(), simd.data(), floats.size());
  narrow_half_scalar(floats.data(), scalar.data(), floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i)
    ASSERT_EQ(simd[i], scalar[i]) << "float bits 0x" << std::hex << std::bit_cast<std::uint32_t>(floats[i]);
  RecordProperty("f16c", has_f16c() ? "yes" : "no (both sides scalar)");
}

}  // namespace
}  // namespace lockstep
