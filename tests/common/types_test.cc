// The dtype / op / collective tables.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace lockstep
