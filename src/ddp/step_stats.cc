// Step statistics and straggler detection; see lockstep/step_stats.h.
#include "lockstep/step_stats.h"

#include <algorithm>

#include <fmt/format.h>

namespace lockstep {

double RankSummary::overlap() const {
  if (comm_ms <= 0) return 1.0;
  return std::clamp(1.0 - exposed_ms / comm_ms, 0.0, 1.0);
}

void StepAccumulator::add(double step_ms, double exposed_ms, double comm_ms, double data_ms, double bytes) {
  ++steps_;
  step_ += step_ms;
  exposed_ += exposed_ms;
  comm_ += comm_ms;
  data_ += data_ms;
  bytes_ += bytes;
}

RankSummary StepAccumulator::summary(int rank) const {
  RankSummary s;
  s.rank = rank;
  s.steps = steps_;
  if (steps_ == 0) return s;
  const double n = static_cast<double>(steps_);
  s.step_ms = step_ / n;
  s.exposed_ms = exposed_ / n;
  s.comm_ms = comm_ / n;
  s.data_ms = data_ / n;
  s.bytes = bytes_ / n;
  s.compute_ms = std::max(0.0, s.step_ms - s.exposed_ms - s.data_ms);
  return s;
}

double median_compute_ms(const std::vector<RankSummary>& window) {
  if (window.empty()) return 0;
  std::vector<double> v;
  for (const auto& r : window) v.push_back(r.compute_ms);
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<int> slow_ranks(const std::vector<RankSummary>& window, double factor, double min_ms) {
  std::vector<int> out;
  if (window.size() < 2) return out;
  const double median = median_compute_ms(window);
  for (const auto& r : window)
    if (r.steps > 0 && r.compute_ms > median * factor && r.compute_ms - median > min_ms) out.push_back(r.rank);
  return out;
}

std::vector<int> StragglerDetector::add(const std::vector<RankSummary>& window) {
  history_.push_back(slow_ranks(window));
  if (history_.size() > keep_) history_.pop_front();
  std::vector<int> out;
  std::vector<int> candidates;
  for (const auto& w : history_) candidates.insert(candidates.end(), w.begin(), w.end());
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (int r : candidates) {
    const auto times = std::count_if(history_.begin(), history_.end(),
                                     [&](const auto& w) { return std::find(w.begin(), w.end(), r) != w.end(); });
    if (2 * static_cast<std::size_t>(times) > history_.size()) out.push_back(r);
  }
  return out;
}

std::string describe_stragglers(const std::vector<RankSummary>& window, const std::vector<int>& stragglers) {
  std::string out;
  const double median = median_compute_ms(window);
  for (int r : stragglers) {
    const auto it = std::find_if(window.begin(), window.end(), [&](const RankSummary& s) { return s.rank == r; });
    if (it == window.end()) continue;
    out += fmt::format("{}rank {} computes {:.1f} ms per step against a median of {:.1f} ms; the other ranks wait for "
                       "it (their exposed communication)",
                       out.empty() ? "" : "\n", r, it->compute_ms, median);
  }
  return out;
}

}  // namespace lockstep
