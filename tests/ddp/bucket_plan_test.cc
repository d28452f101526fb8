// plan_buckets: the pure bucket assignment, checked case by case.
#include <gtest/gtest.h>

#include "lockstep/error.h"
#include "lockstep/reducer.h"

namespace lockstep {
namespace {

std::vector<ParamSpec> floats(std::initializer_list<std::size_t> counts) {
  std::vector<ParamSpec> out;
  for (std::size_t c : counts) out.push_back({"p" + std::to_string(out.size()), c, DType::f32});
  return out;
}

std::vector<std::vector<std::size_t>> layout(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : buckets) out.push_back(b.params);
  return out;
}

TEST(BucketPlan, ReverseOrderWithASmallFirstBucket) {
  // 1 KiB first bucket, 4 KiB later: 256 floats = 1 KiB.
  const auto params = floats({256, 256, 256, 256, 256, 256});
  const auto buckets = plan_buckets(params, reverse_order(params.size()), {1024, 4096});
  EXPECT_EQ(layout(buckets), (std::vector<std::vector<std::size_t>>{{5}, {4, 3, 2, 1}, {0}}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<std::size_t>{0, 256, 512, 768}));
  EXPECT_EQ(buckets[1].count, 1024u);
}

TEST(BucketPlan, ALargeParameterGetsABucketOfItsOwn) {
  const auto params = floats({10, 100000, 10});
  const auto buckets = plan_buckets(params, reverse_order(3), {64, 1024});
  EXPECT_EQ(layout(buckets), (std::vector<std::vector<std::size_t>>{{2, 1}, {0}}));
  const auto tiny = plan_buckets(params, reverse_order(3), {1, 1});
  EXPECT_EQ(layout(tiny), (std::vector<std::vector<std::size_t>>{{2}, {1}, {0}}));
}

TEST(BucketPlan, ACapBelowTheFirstBucketSizeBoundsTheFirstBucketToo) {
  // A 1 KiB cap with the default 1 MiB first bucket: every bucket closes at 1 KiB.
  const auto params = floats({256, 256, 256});
  const auto buckets = plan_buckets(params, reverse_order(3), {1u << 20, 1024});
  EXPECT_EQ(layout(buckets), (std::vector<std::vector<std::size_t>>{{2}, {1}, {0}}));
}

TEST(BucketPlan, OneGiantBucket) {
  const auto params = floats({1000, 2000, 3000});
  const auto buckets = plan_buckets(params, reverse_order(3), {1u << 30, 1u << 30});
  ASSERT_EQ(buckets.size(), 1u);
  EXPECT_EQ(buckets[0].count, 6000u);
}

TEST(BucketPlan, DTypesNeverShareABucket) {
  std::vector<ParamSpec> params = {{"a", 10, DType::f32}, {"b", 10, DType::f64}, {"c", 10, DType::f32}};
  const auto buckets = plan_buckets(params, reverse_order(3), {1u << 20, 1u << 20});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].params, (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(buckets[0].dtype, DType::f32);
  EXPECT_EQ(buckets[1].params, (std::vector<std::size_t>{1}));
  EXPECT_EQ(buckets[1].dtype, DType::f64);
}

TEST(BucketPlan, FollowsAnObservedOrder) {
  const auto params = floats({256, 256, 256, 256});
  const auto buckets = plan_buckets(params, {2, 0, 3, 1}, {1024, 2048});
  EXPECT_EQ(layout(buckets), (std::vector<std::vector<std::size_t>>{{2}, {0, 3}, {1}}));
}

TEST(BucketPlan, RejectsAnOrderThatIsNotAPermutation) {
  const auto params = floats({1, 2, 3});
  EXPECT_THROW(plan_buckets(params, {0, 1}, {}), InvalidArgument);
  EXPECT_THROW(plan_buckets(params, {0, 1, 1}, {}), InvalidArgument);
  EXPECT_THROW(plan_buckets(params, {0, 1, 7}, {}), InvalidArgument);
}

TEST(BucketPlan, DefaultsAreOneAndTwentyFiveMebibytes) {
  const BucketPlanOptions options;
  EXPECT_EQ(options.first_bucket_bytes, 1u << 20);
  EXPECT_EQ(options.bucket_cap_bytes, 25u << 20);
}

}  // namespace
}  // namespace lockstep
