// The pure parts of the diagnostics: rank lists, fingerprint comparison, the
// watchdog's verdict, the flight recorder's ring, trace files and their
// merge, step statistics and straggler detection.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "diag/fingerprint.h"
#include "diag/flight_recorder.h"
#include "diag/tracer.h"
#include "diag/watchdog_report.h"
#include "harness/launcher.h"
#include "lockstep/step_stats.h"

namespace lockstep {
namespace {

using diag::Fingerprint;
using diag::RankProgress;

using testing::contains;

TEST(RankList, CollapsesRuns) {
  EXPECT_EQ(diag::rank_list({}), "");
  EXPECT_EQ(diag::rank_list({3}), "3");
  EXPECT_EQ(diag::rank_list({0, 1}), "0, 1");
  EXPECT_EQ(diag::rank_list({0, 2, 5, 6, 7}), "0, 2, 5-7");
}

OpInfo allreduce_of(std::size_t count) {
  OpInfo info;
  info.collective = Collective::allreduce;
  info.count = count;
  return info;
}

TEST(Fingerprints, AgreeingRanksGiveNoMessage) {
  const auto f = diag::fingerprint(allreduce_of(10), 4);
  EXPECT_EQ(diag::compare_fingerprints({f, f, f}), "");
}

TEST(Fingerprints, TheOddRankIsNamedFirstWithBothFingerprints) {
  OpInfo bcast;
  bcast.collective = Collective::broadcast;
  bcast.count = 10;
  bcast.peer = 0;
  const auto a = diag::fingerprint(allreduce_of(1000), 0), b = diag::fingerprint(bcast, 0);
  EXPECT_EQ(diag::compare_fingerprints({a, b, a}),
            "rank 1 issued broadcast #0 (float x 10, root 0) while ranks 0, 2 issued allreduce #0 (float x 1000, sum)");
}

TEST(Fingerprints, ACountOrSequenceDifferenceIsAMismatch) {
  EXPECT_NE(diag::compare_fingerprints({diag::fingerprint(allreduce_of(10), 1), diag::fingerprint(allreduce_of(11), 1)}), "");
  EXPECT_NE(diag::compare_fingerprints({diag::fingerprint(allreduce_of(10), 1), diag::fingerprint(allreduce_of(10), 2)}), "");
}

TEST(Fingerprints, TheRootOfAnAllreduceDoesNotMatter) {
  OpInfo a = allreduce_of(5), b = allreduce_of(5);
  b.peer = 3;  // meaningless for allreduce
  EXPECT_EQ(diag::fingerprint(a, 0), diag::fingerprint(b, 0));
}

RankProgress progress(int rank, std::uint64_t issued, std::string running = {}) {
  RankProgress p;
  p.rank = rank;
  p.issued = issued;
  p.running = std::move(running);
  p.last_completed = issued > 0 ? "allreduce #" + std::to_string(issued - 1) : "";
  p.host = "h";
  p.pid = 100 + rank;
  return p;
}

TEST(WatchdogVerdict, NamesRanksBehindAndSilentRanks) {
  std::vector<std::optional<RankProgress>> all = {progress(0, 6, "allreduce #5"), progress(1, 5), std::nullopt,
                                                  progress(3, 6, "allreduce #5")};
  const std::string v = diag::verdict(5, "allreduce #5 (float x 4, sum)", 0, all);
  EXPECT_TRUE(contains(v, "operation #5 (allreduce #5 (float x 4, sum)) did not complete")) << v;
  EXPECT_TRUE(contains(v, "rank(s) 1 never reached #5")) << v;
  EXPECT_TRUE(contains(v, "rank(s) 2 did not answer")) << v;
  EXPECT_TRUE(contains(v, "rank 3 (pid 103 on h): issued 6 operation(s); running allreduce #5")) << v;
  EXPECT_TRUE(contains(v, "rank 1 (pid 101 on h): issued 5 operation(s); running nothing; last completed: allreduce #4"))
      << v;
}

TEST(WatchdogVerdict, RanksRunningDifferentOperationsAtTheSameNumberAreAMismatch) {
  std::vector<std::optional<RankProgress>> all = {progress(0, 1, "reduce #0 (float x 5000, sum, root 0)"),
                                                  progress(1, 1, "reduce #0 (float x 5000, sum, root 1) [bucket 0]")};
  const std::string v = diag::verdict(0, "reduce #0 (float x 5000, sum, root 0)", 0, all);
  EXPECT_TRUE(contains(v, "the ranks disagree on operation #0")) << v;
  EXPECT_TRUE(contains(v, "rank(s) 0 run reduce #0 (float x 5000, sum, root 0);")) << v;
  EXPECT_TRUE(contains(v, "rank(s) 1 run reduce #0 (float x 5000, sum, root 1);")) << v;
  // The same operation everywhere (one rank merely queued) is no disagreement.
  all = {progress(0, 1, "allreduce #0 (float x 4, sum)"), progress(1, 1, "allreduce #0 (float x 4, sum) (queued)")};
  EXPECT_FALSE(contains(diag::verdict(0, "allreduce #0 (float x 4, sum)", 0, all), "disagree"));
}

TEST(WatchdogVerdict, ProgressSurvivesTheStore) {
  const auto p = progress(2, 7, "broadcast #6");
  const auto back = RankProgress::decode(p.encode());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->issued, 7u);
  EXPECT_EQ(back->running, "broadcast #6");
  EXPECT_EQ(back->pid, 102);
  EXPECT_FALSE(RankProgress::decode("not json"));
}

TEST(FlightRecorder, KeepsTheLastOperationsInOrder) {
  diag::FlightRecorder recorder(4);
  for (std::uint64_t seq = 0; seq < 6; ++seq) {
    recorder.issued(seq, allreduce_of(seq + 1), 10 * static_cast<std::int64_t>(seq));
    if (seq < 5) recorder.finished(seq, true, 10 * static_cast<std::int64_t>(seq) + 5);
  }
  recorder.label(5, "bucket 0");
  recorder.label(0, "gone");  // out of the ring: ignored
  const auto records = recorder.snapshot();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records.front().seq, 2u);
  EXPECT_EQ(records.back().seq, 5u);
  EXPECT_EQ(records.back().state, diag::OpState::issued);
  EXPECT_EQ(records[2].state, diag::OpState::completed);
  EXPECT_EQ(recorder.label_of(5), "bucket 0");
  EXPECT_EQ(recorder.label_of(0), "");
  const std::string summary = recorder.summary();
  EXPECT_TRUE(contains(summary, "last completed: allreduce #4")) << summary;
  EXPECT_TRUE(contains(summary, "in flight: allreduce #5 (float x 6, sum) [bucket 0] (issued)")) << summary;
  const auto j = nlohmann::json::parse(recorder.to_json("rank 0"));
  EXPECT_EQ(j["operations"].size(), 4u);
  EXPECT_EQ(j["operations"][3]["label"], "bucket 0");
}

TEST(FlightRecorder, AFailureIsRecorded) {
  diag::FlightRecorder recorder;
  recorder.issued(0, allreduce_of(1), 1);
  recorder.started(0, 2);
  recorder.finished(0, false, 3);
  EXPECT_EQ(recorder.snapshot()[0].state, diag::OpState::failed);
  EXPECT_EQ(recorder.snapshot()[0].started_us, 2);
}

TEST(Tracer, WritesAChromeTraceAndMergesRanks) {
  testing::TempDir dir;
  const std::string prefix = dir.path() + "/t";
  {
    diag::Tracer rank0(prefix, 0), rank1(prefix, 1), off("", 2);
    rank0.event("forward", "step", 100, 250);
    rank0.event("allreduce #0", "collectives", 200, 190);  // end before start: clamped to zero length
    rank1.event("forward", "step", 110, 260);
    off.event("ignored", "step", 0, 1);
    EXPECT_FALSE(off.enabled());
    EXPECT_EQ(off.write(), "");
  }
  const auto one = nlohmann::json::parse(std::ifstream(prefix + ".rank0.json"));
  int complete = 0;
  for (const auto& e : one["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++complete;
    EXPECT_EQ(e["pid"], 0);
    EXPECT_GE(e["dur"].get<std::int64_t>(), 0);
  }
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(diag::merge_traces({prefix + ".rank0.json", prefix + ".rank1.json", prefix + ".rank9.json"}, prefix + ".json"), 2u);
  const auto merged = nlohmann::json::parse(std::ifstream(prefix + ".json"));
  std::set<int> pids;
  for (const auto& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_EQ(diag::merge_traces({prefix + ".rank7.json"}, dir.path() + "/none.json"), 0u);
  EXPECT_FALSE(std::ifstream(dir.path() + "/none.json")) << "no empty timeline when nothing was traced";
}

RankSummary rank_with(int rank, double compute_ms, double exposed_ms = 0) {
  StepAccumulator a;
  a.add(compute_ms + exposed_ms, exposed_ms, exposed_ms + 1, 0, 1000);
  return a.summary(rank);
}

TEST(StepStatistics, SplitsAStepIntoComputeExposedCommunicationAndData) {
  StepAccumulator a;
  a.add(/*step*/ 100, /*exposed*/ 20, /*comm*/ 50, /*data*/ 10, /*bytes*/ 4096);
  a.add(120, 30, 70, 10, 4096);
  const auto s = a.summary(3);
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.steps, 2u);
  EXPECT_DOUBLE_EQ(s.step_ms, 110);
  EXPECT_DOUBLE_EQ(s.exposed_ms, 25);
  EXPECT_DOUBLE_EQ(s.data_ms, 10);
  EXPECT_DOUBLE_EQ(s.compute_ms, 75);
  EXPECT_DOUBLE_EQ(s.overlap(), 1 - 25.0 / 60);
  EXPECT_DOUBLE_EQ(s.bytes, 4096);
  EXPECT_EQ(StepAccumulator{}.summary(0).steps, 0u);
}

TEST(StepStatistics, ARankComputingLongerThanTheMedianIsSlow) {
  // Rank 2 computes 40 ms; the others wait for it (exposed communication).
  const std::vector<RankSummary> w = {rank_with(0, 20, 20), rank_with(1, 21, 19), rank_with(2, 40)};
  EXPECT_EQ(slow_ranks(w), std::vector<int>{2});
  EXPECT_TRUE(contains(describe_stragglers(w, {2}), "rank 2 computes 40.0 ms per step against a median of 21.0 ms"));
  // Noise below the thresholds is not a straggler.
  EXPECT_TRUE(slow_ranks({rank_with(0, 20), rank_with(1, 22)}).empty());
  EXPECT_TRUE(slow_ranks({rank_with(0, 0.5), rank_with(1, 1.2)}).empty()) << "under 1 ms apart";
  EXPECT_TRUE(slow_ranks({rank_with(0, 20)}).empty());
}

TEST(StepStatistics, AStragglerMustBeSlowInMostRecentWindows) {
  StragglerDetector detector(3);
  const std::vector<RankSummary> slow1 = {rank_with(0, 10), rank_with(1, 30), rank_with(2, 10)};
  const std::vector<RankSummary> even = {rank_with(0, 10), rank_with(1, 10), rank_with(2, 10)};
  EXPECT_EQ(detector.add(slow1), std::vector<int>{1});  // one window of one
  EXPECT_TRUE(detector.add(even).empty());              // one of two: not a majority
  EXPECT_EQ(detector.add(slow1), std::vector<int>{1});  // two of three
  EXPECT_TRUE(detector.add(even).empty());              // one of the last three
}

}  // namespace
}  // namespace lockstep
