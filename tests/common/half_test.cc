// fp16/bf16 conversion: exhaustive round trips, rounding to nearest even,
// overflow, subnormals, NaN and Inf.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/half.h"

namespace lockstep {
namespace {

bool is_half_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool is_bf16_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

TEST(Half, EveryHalfValueRoundTripsThroughFloat) {
  for (std::uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = half_to_float(h);
    if (is_half_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      EXPECT_TRUE(is_half_nan(float_to_half(f))) << std::hex << i;
    } else {
      EXPECT_EQ(float_to_half(f), h) << std::hex << i;
    }
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
}

TEST(Half, RoundsToNearestTiesToEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even (1.0).
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
  EXPECT_EQ(float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);
  // Just above the halfway point rounds up.
  EXPECT_EQ(float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  // Subnormal tie: 1.5 * 2^-24 goes to the even 2 * 2^-24; 0.5 * 2^-24 to 0.
  EXPECT_EQ(float_to_half(1.5f * 0x1p-24f), 0x0002);
  EXPECT_EQ(float_to_half(0.5f * 0x1p-24f), 0x0000);
  EXPECT_EQ(float_to_half(2.5f * 0x1p-24f), 0x0002);
}

TEST(Half, OverflowBecomesInfinityAndInfinityStays) {
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);  // below the halfway point
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the tie rounds to even: Inf
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isinf(half_to_float(0x7c00)));
  EXPECT_TRUE(is_half_nan(float_to_half(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_half_nan(float_to_half(std::bit_cast<float>(0x7f800001u))));  // signalling NaN stays NaN
}

#if defined(__FLT16_MAX__)
// The compiler's own _Float16 conversion is correctly rounded; compare on a
// spread of float bit patterns covering every exponent.
TEST(Half, AgreesWithCompilerFloat16OnManyFloats) {
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 997) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (std::isnan(f)) continue;
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(float_to_half(f), want) << std::hex << bits;
  }
}
#endif

TEST(BFloat16, EveryValueRoundTripsThroughFloat) {
  for (std::uint32_t i = 0; i <= 0xffff; ++i) {
    const auto b = static_cast<std::uint16_t>(i);
    if (is_bf16_nan(b)) {
      EXPECT_TRUE(is_bf16_nan(float_to_bf16(bf16_to_float(b))));
    } else {
      EXPECT_EQ(float_to_bf16(bf16_to_float(b)), b) << std::hex << i;
    }
  }
}

TEST(BFloat16, RoundsToNearestTiesToEvenAndKeepsSpecials) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);              // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);          // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);   // above the tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to Inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(is_bf16_nan(float_to_bf16(std::bit_cast<float>(0x7f800001u))));  // low-payload NaN stays NaN
}

}  // namespace
}  // namespace lockstep
