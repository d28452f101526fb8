// Doctor's rules on measured points: each cause of poor scaling is named
// with its numbers and a remedy, and a job that scales is left alone.
#include <gtest/gtest.h>

#include "doctor/diagnosis.h"

namespace lockstep::cli {
namespace {

bool contains(const std::vector<std::string>& lines, const std::string& what) {
  for (const auto& l : lines)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

ScalePoint point(int ranks, double step, double compute, double exposed, double comm = 0) {
  ScalePoint p;
  p.ranks = ranks;
  p.step_ms = step;
  p.compute_ms = compute;
  p.exposed_ms = exposed;
  p.comm_ms = comm;
  p.overlap = comm > 0 ? 1 - exposed / comm : 1;
  p.bytes_per_step = 64 << 20;
  p.buckets = 3;
  return p;
}

TEST(Diagnosis, WeakScalingEfficiencyIsT1OverTn) {
  const auto d = diagnose({point(1, 100, 100, 0), point(2, 125, 100, 25, 30)}, /*strong=*/false, 2);
  ASSERT_EQ(d.efficiency.size(), 2u);
  EXPECT_DOUBLE_EQ(d.efficiency[0], 1.0);
  EXPECT_DOUBLE_EQ(d.efficiency[1], 0.8);
}

TEST(Diagnosis, StrongScalingEfficiencyDividesBySpeedUpPerRank) {
  const auto d = diagnose({point(1, 100, 100, 0), point(4, 40, 30, 10, 12)}, /*strong=*/true, 4);
  EXPECT_DOUBLE_EQ(d.efficiency[1], 100.0 / (4 * 40));
}

TEST(Diagnosis, ExposedCommunicationSuggestsBucketsAccumulationAndCompression) {
  auto last = point(2, 150, 100, 50, 60);
  last.buckets = 1;
  last.bucket_cap_mb = 100;
  const auto d = diagnose({point(1, 100, 100, 0), last}, false, 2);
  EXPECT_TRUE(contains(d.findings, "Communication not hidden: 50.0 ms of each 150.0 ms step (33%)"));
  EXPECT_TRUE(contains(d.suggestions, "lower bucket_cap_mb (now 100) to about 16.0"));
  EXPECT_TRUE(contains(d.suggestions, "no_sync()"));
  EXPECT_TRUE(contains(d.suggestions, "fp16_compress_hook()"));
}

TEST(Diagnosis, MoreRanksThanCoresIsNamed) {
  const auto d = diagnose({point(1, 100, 100, 0), point(4, 300, 250, 50, 60)}, false, 2);
  EXPECT_TRUE(contains(d.findings, "4 ranks share 2 core(s)"));
  EXPECT_TRUE(contains(d.suggestions, "at most 2 rank(s) per host"));
}

TEST(Diagnosis, SlowerComputeAtTheSameWorkIsSharedHardware) {
  const auto d = diagnose({point(1, 100, 100, 0), point(2, 130, 128, 2, 20)}, false, 2);
  EXPECT_TRUE(contains(d.findings, "Compute slows down with more ranks"));
  EXPECT_TRUE(contains(d.findings, "+28%"));
}

TEST(Diagnosis, DataLoadingAndStragglersAreNamed) {
  auto last = point(2, 100, 60, 5, 20);
  last.data_ms = 35;
  last.stragglers = {"rank 1 computes 90.0 ms per step against a median of 60.0 ms; ..."};
  const auto d = diagnose({point(1, 95, 60, 0), last}, false, 2);
  EXPECT_TRUE(contains(d.findings, "Data loading takes 35.0 ms of each 100.0 ms step (35%)"));
  EXPECT_TRUE(contains(d.suggestions, "workers"));
  EXPECT_TRUE(contains(d.findings, "Straggler(s) on 2 ranks:\n  - rank 1 computes 90.0 ms"));
}

TEST(Diagnosis, AJobThatScalesIsLeftAlone) {
  const auto d = diagnose({point(1, 100, 100, 0), point(2, 102, 100, 2, 30)}, false, 2);
  EXPECT_TRUE(d.suggestions.empty());
  EXPECT_TRUE(contains(d.findings, "It scales well"));
}

TEST(Diagnosis, TheReportHasATableRowPerWorldSize) {
  const std::vector<ScalePoint> points = {point(1, 100, 100, 0), point(2, 125, 100, 25, 30)};
  const auto d = diagnose(points, false, 2);
  const std::string report = render_report(points, d, false, "test workload", 2);
  EXPECT_NE(report.find("| 1 | 100.0 | 100.0 | 0.0 |"), std::string::npos) << report;
  EXPECT_NE(report.find("| 2 | 125.0 | 100.0 | 25.0 | 30.0 | 0.0 | 64.0 | 17% | 0.80 |"), std::string::npos) << report;
  EXPECT_NE(report.find("## What to try"), std::string::npos) << report;
}

}  // namespace
}  // namespace lockstep::cli
