// The DDP benchmark example, run directly as a world of one: its numeric
// options are range-checked before anything runs, and a short run still
// reports its step time, under DDP and fully sharded.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "harness/launcher.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::contains;

// --steps 0 used to end in SIGSEGV (the median of no timings), and
// --batch -5 in a libtorch stack trace.
TEST(DdpThroughput, ArgumentsOutOfRangeAreRefusedBeforeTraining) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--batch", "0"}, "--batch: '0' is not a whole number of 1 or more"},
      {{"--batch", "-5"}, "--batch: '-5' is not a whole number of 1 or more"},
      {{"--steps", "0"}, "--steps: '0' is not a whole number of 1 or more"},
      {{"--warmup", "-1"}, "--warmup: '-1' is not a whole number of 0 or more"},
      {{"--bucket-cap-mb", "nan"}, "--bucket-cap-mb: 'nan' is not a number above 0"},
      {{"--bucket-cap-mb", "0"}, "--bucket-cap-mb: '0' is not a number above 0"},
      {{"--powersgd-rank", "0"}, "--powersgd-rank: '0' is not a whole number of 1 or more"},
      {{"--model", "resnet"}, "--model: resnet not in {mlp,wide-mlp,deep-mlp,convnet}"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = testing::run_program(DDP_THROUGHPUT, args, {}, 60s);
    EXPECT_EQ(r.signal, 0) << testing::describe(r);
    EXPECT_NE(r.exit_code, 0) << args[0] << " " << args[1] << ": " << testing::describe(r);
    EXPECT_TRUE(contains(r.output, message)) << r.output;
    EXPECT_FALSE(contains(r.output, "step_ms")) << r.output;
  }
}

// The example still trains and reports after its arguments are checked.
TEST(DdpThroughput, AShortRunReportsItsStepTime) {
  const auto r = testing::run_program(
      DDP_THROUGHPUT, {"--model", "convnet", "--batch", "4", "--steps", "2", "--warmup", "1"}, {{"LOCAL_RANK", "0"}}, 60s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "1 rank(s)")) << r.output;
  EXPECT_TRUE(contains(r.output, "step_ms ")) << r.output;
}

// The GPU benchmarks' model (6 x Linear(4096, 4096)) trains at a batch a
// CPU can take, with inputs of its own width.
TEST(DdpThroughput, TheWideMlpTrainsAtTheBatchGiven) {
  const auto r = testing::run_program(
      DDP_THROUGHPUT, {"--model", "wide-mlp", "--batch", "2", "--steps", "1", "--warmup", "0"}, {{"LOCAL_RANK", "0"}},
      60s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "model wide-mlp (100.7M parameters)")) << r.output;
  EXPECT_TRUE(contains(r.output, "batch 2 per rank")) << r.output;
  EXPECT_TRUE(contains(r.output, "step_ms ")) << r.output;
}

// --fsdp shards the MLPs, one unit per Linear, so it has no use for the
// convnet or for DDP's options; both are refused before anything runs.
TEST(DdpThroughput, FullyShardedTakesTheMlpsWithoutDdpsOptions) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--fsdp", "--model", "convnet"}, "--fsdp shards the MLPs (mlp, wide-mlp, deep-mlp), not the convnet"},
      {{"--fsdp", "--no-sync"}, "--no-sync excludes --fsdp"},
      {{"--fsdp", "--hook", "fp16"}, "--hook excludes --fsdp"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = testing::run_program(DDP_THROUGHPUT, args, {}, 60s);
    EXPECT_EQ(r.signal, 0) << testing::describe(r);
    EXPECT_NE(r.exit_code, 0) << testing::describe(r);
    EXPECT_TRUE(contains(r.output, message)) << r.output;
    EXPECT_FALSE(contains(r.output, "step_ms")) << r.output;
  }
}

// The fully sharded benchmarks' model (8 x Linear(1024, 1024)) trains
// fully sharded and reports the whole model's size, not this rank's shards.
TEST(DdpThroughput, AFullyShardedRunReportsItsStepTime) {
  const auto r = testing::run_program(
      DDP_THROUGHPUT, {"--model", "deep-mlp", "--fsdp", "--batch", "2", "--steps", "2", "--warmup", "1"},
      {{"LOCAL_RANK", "0"}}, 60s);
  ASSERT_EQ(r.exit_code, 0) << testing::describe(r);
  EXPECT_TRUE(contains(r.output, "model deep-mlp (8.4M parameters)")) << r.output;
  EXPECT_TRUE(contains(r.output, "fully sharded")) << r.output;
  EXPECT_TRUE(contains(r.output, "step_ms ")) << r.output;
}

}  // namespace
}  // namespace lockstep
