// The dtype / op / collective tables.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "lockstep/types.h"

namespace lockstep {
namespace {

TEST(Types, SizesOfEveryDType) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
}

TEST(Types, NamesRoundTrip) {
  for (DType t : kAllDTypes) EXPECT_EQ(parse_dtype(to_string(t)), t);
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(parse_reduce_op(to_string(op)), op);
  for (int i = 0; i <= static_cast<int>(Collective::recv); ++i) {
    const auto c = static_cast<Collective>(i);
    EXPECT_EQ(parse_collective(to_string(c)), c);
  }
}

TEST(Types, AcceptsCommonAliases) {
  EXPECT_EQ(parse_dtype("float32"), DType::f32);
  EXPECT_EQ(parse_dtype("HALF"), DType::f16);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_reduce_op("mean"), ReduceOp::avg);
  EXPECT_EQ(parse_collective("all_reduce"), Collective::allreduce);
  EXPECT_FALSE(parse_dtype("complex64").has_value());
}

TEST(Types, BufferBytes) {
  std::vector<double> v(10);
  EXPECT_EQ(view(std::span(v)).bytes(), 80u);
  EXPECT_EQ(ConstBuffer(view(std::span(v))).count, 10u);
}

TEST(Types, ElementsRoundTripThroughDoubleInEveryDtype) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    std::vector<std::byte> buffer(4 * dtype_size(dtype));
    for (std::size_t i = 0; i < 4; ++i) store_from_double(buffer.data(), dtype, i, static_cast<double>(i * 3) + 1);
    for (std::size_t i = 0; i < 4; ++i)
      EXPECT_EQ(load_as_double(buffer.data(), dtype, i), static_cast<double>(i * 3) + 1) << to_string(dtype);
  }
}

TEST(Types, StoringADoubleRoundsFloatsAndWrapsIntegers) {
  std::uint8_t u8 = 0;
  store_from_double(&u8, DType::u8, 0, -1.0);
  EXPECT_EQ(u8, 255);
  std::int32_t i32 = 0;
  store_from_double(&i32, DType::i32, 0, -2.9);
  EXPECT_EQ(i32, -2);  // truncated toward zero
  std::uint16_t bf16 = 0;
  store_from_double(&bf16, DType::bf16, 0, 1.0 + 1.0 / 256);  // halfway between 1 and the next bf16: to even
  EXPECT_EQ(load_as_double(&bf16, DType::bf16, 0), 1.0);
  std::uint16_t f16 = 0;
  store_from_double(&f16, DType::f16, 0, 65504.0);  // the largest half
  EXPECT_EQ(load_as_double(&f16, DType::f16, 0), 65504.0);
}

}  // namespace
}  // namespace lockstep
