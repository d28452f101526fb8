// Where a data-parallel step's time goes, per rank and across ranks.
//
// Each rank accumulates its steps (a step runs from one forward to the
// next): total time, the communication the backward pass did not hide
// (exposed), the time its buckets spent in collectives, data loading when the
// program marks it, and bytes reduced. Compute is what remains: step minus
// exposed communication minus data loading.
//
// Across ranks, a straggler shows up as compute, not step time: in
// synchronous training every rank's step is as long as the slowest's, but
// the fast ranks spend the difference waiting (exposed communication). A
// rank whose compute exceeds the median by more than 15% (and 1 ms) in most
// recent windows is named.
// Values and pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace lockstep {

struct RankSummary {
  int rank = 0;
  std::size_t steps = 0;
  double step_ms = 0;      // per step, averages over the steps
  double compute_ms = 0;
  double exposed_ms = 0;
  double comm_ms = 0;      // time buckets spent inside collectives
  double data_ms = 0;
  double bytes = 0;        // reduced per step
  // Share of communication hidden behind compute: 1 - exposed / comm.
  double overlap() const;
};

// Sums steps into a RankSummary.
class StepAccumulator {
 public:
  void add(double step_ms, double exposed_ms, double comm_ms, double data_ms, double bytes);
  RankSummary summary(int rank) const;
  std::size_t steps() const { return steps_; }
  void clear() { *this = StepAccumulator{}; }

 private:
  std::size_t steps_ = 0;
  double step_ = 0, exposed_ = 0, comm_ = 0, data_ = 0, bytes_ = 0;
};

// Ranks whose compute is over the median by more than `factor` (and
// `min_ms`) in this window.
std::vector<int> slow_ranks(const std::vector<RankSummary>& window, double factor = 1.15, double min_ms = 1.0);

// Remembers the last few windows and names ranks slow in most of them.
class StragglerDetector {
 public:
  explicit StragglerDetector(std::size_t windows = 3) : keep_(windows) {}
  // Returns the ranks slow in a majority of the remembered windows.
  std::vector<int> add(const std::vector<RankSummary>& window);

 private:
  std::size_t keep_;
  std::deque<std::vector<int>> history_;
};

// One line per straggler, with the numbers: "rank 2 computes 182.0 ms per
// step against a median of 121.0 ms; the others wait for it".
std::string describe_stragglers(const std::vector<RankSummary>& window, const std::vector<int>& stragglers);

// Median of compute_ms.
double median_compute_ms(const std::vector<RankSummary>& window);

}  // namespace lockstep
