// Doctor's rules; see diagnosis.h. Each rule looks at one cause of poor
// scaling, states it with the numbers behind it, and says what to try.
#include "doctor/diagnosis.h"

#include <algorithm>

#include <fmt/format.h>

namespace lockstep::cli {
namespace {

constexpr double kGoodEfficiency = 0.9;

double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0; }

void scaling_rule(const std::vector<ScalePoint>& p, const Diagnosis& d, bool strong, Diagnosis& out) {
  const ScalePoint& one = p.front();
  const ScalePoint& last = p.back();
  out.findings.push_back(fmt::format(
      "{} scaling: {:.1f} ms per step on {} rank(s), {:.1f} ms on {}; efficiency {:.2f} ({} is good).",
      strong ? "Strong" : "Weak", one.step_ms, one.ranks, last.step_ms, last.ranks, d.efficiency.back(),
      kGoodEfficiency));
}

void exposed_rule(const ScalePoint& last, Diagnosis& out) {
  if (last.ranks < 2 || pct(last.exposed_ms, last.step_ms) < 10) return;
  const double mib = last.bytes_per_step / (1 << 20);
  out.findings.push_back(fmt::format(
      "Communication not hidden: {:.1f} ms of each {:.1f} ms step ({:.0f}%) is spent waiting for gradient "
      "communication that backward did not hide. The collectives themselves take {:.1f} ms per step for {:.1f} MiB; "
      "{:.0f}% of that overlaps backward.",
      last.exposed_ms, last.step_ms, pct(last.exposed_ms, last.step_ms), last.comm_ms, mib, 100 * last.overlap));
  if (last.buckets <= 1)
    out.suggestions.push_back(fmt::format(
        "All gradients travel in one bucket, so nothing is sent until backward is over: lower bucket_cap_mb "
        "(now {:.0f}) to about {:.1f} so that reduction starts while backward still runs.",
        last.bucket_cap_mb, std::max(1.0, mib / 4)));
  else if (last.overlap < 0.5)
    out.suggestions.push_back(fmt::format(
        "Little communication overlaps backward with {} buckets: the last buckets finish after backward; a smaller "
        "bucket_cap_mb (now {:.0f}) spreads the work, a larger one cuts per-bucket overhead if buckets are tiny.",
        last.buckets, last.bucket_cap_mb));
  out.suggestions.push_back(
      "Accumulate gradients over k micro-batches with no_sync() (DistributedDataParallel::no_sync): communication "
      "per sample falls k-fold.");
  if (last.compression == "none")
    out.suggestions.push_back("Compress gradients to 16 bits (DDPOptions::comm_hook = fp16_compress_hook() or "
                              "bf16_compress_hook()): half the bytes per step.");
}

void oversubscription_rule(const std::vector<ScalePoint>& p, int cores, Diagnosis& out) {
  const ScalePoint& last = p.back();
  if (last.ranks <= cores) return;
  out.findings.push_back(fmt::format("{} ranks share {} core(s): ranks wait for a core as well as for each other.",
                                     last.ranks, cores));
  out.suggestions.push_back(fmt::format("Run at most {} rank(s) per host (one per core), with one compute thread "
                                        "each (OMP_NUM_THREADS=1, the default under lockstep run).",
                                        cores));
}

// Weak scaling gives every rank the same work, so slower compute means the
// ranks contend: for memory bandwidth and caches, and on CPUs for the cores
// themselves, where the overlapped reduction (copies and sums) runs too.
void compute_rule(const std::vector<ScalePoint>& p, bool strong, Diagnosis& out) {
  if (strong || p.size() < 2) return;
  const ScalePoint& one = p.front();
  const ScalePoint& last = p.back();
  if (one.compute_ms <= 0 || last.compute_ms < one.compute_ms * 1.15) return;
  out.findings.push_back(fmt::format(
      "Compute slows down with more ranks although each does the same work: {:.1f} ms alone, {:.1f} ms on {} ranks "
      "(+{:.0f}%). The ranks share memory bandwidth and caches, and the reduction that overlaps backward ({:.1f} ms "
      "of copies and sums per step) runs on the same cores as the compute.",
      one.compute_ms, last.compute_ms, last.ranks, pct(last.compute_ms - one.compute_ms, one.compute_ms),
      last.comm_ms));
  const bool said = std::any_of(out.suggestions.begin(), out.suggestions.end(),
                                [](const std::string& s) { return s.find("no_sync()") != std::string::npos; });
  if (last.comm_ms > 0.1 * last.compute_ms && !said)
    out.suggestions.push_back(
        "Communicate less often: accumulating gradients over k micro-batches with no_sync() leaves the cores to "
        "compute for k-1 of every k backward passes.");
}

void data_rule(const ScalePoint& last, Diagnosis& out) {
  if (pct(last.data_ms, last.step_ms) < 10) return;
  out.findings.push_back(fmt::format("Data loading takes {:.1f} ms of each {:.1f} ms step ({:.0f}%).", last.data_ms,
                                     last.step_ms, pct(last.data_ms, last.step_ms)));
  out.suggestions.push_back("Load batches in background workers (torch::data::DataLoaderOptions::workers) or "
                            "prefetch the next batch while the step runs.");
}

void straggler_rule(const std::vector<ScalePoint>& p, Diagnosis& out) {
  for (const auto& point : p) {
    if (point.stragglers.empty()) continue;
    std::string lines;
    for (const auto& s : point.stragglers) lines += "\n  - " + s;
    out.findings.push_back(fmt::format("Straggler(s) on {} ranks:{}", point.ranks, lines));
    out.suggestions.push_back("Find out why the named rank is slower (another process on its core, a slower "
                              "device, more data): every other rank waits for it each step.");
  }
}

}  // namespace

Diagnosis diagnose(const std::vector<ScalePoint>& points, bool strong, int cores) {
  Diagnosis d;
  if (points.empty()) return d;
  for (const auto& p : points) {
    const double t1 = points.front().step_ms;
    const double speedup = p.step_ms > 0 ? t1 / p.step_ms : 0;
    d.efficiency.push_back(strong ? speedup * points.front().ranks / p.ranks : speedup);
  }
  scaling_rule(points, d, strong, d);
  exposed_rule(points.back(), d);
  oversubscription_rule(points, cores, d);
  compute_rule(points, strong, d);
  data_rule(points.back(), d);
  straggler_rule(points, d);
  if (d.efficiency.back() >= kGoodEfficiency && d.suggestions.empty())
    d.findings.push_back("It scales well: nothing to change at these sizes.");
  return d;
}

std::string render_report(const std::vector<ScalePoint>& points, const Diagnosis& d, bool strong,
                          const std::string& workload, int cores) {
  std::string out = fmt::format("# lockstep doctor\n\nWorkload: `{}`, {} scaling, {} core(s) available.\n\n", workload,
                                strong ? "strong (fixed global batch)" : "weak (fixed batch per rank)", cores);
  out += "| ranks | step (ms) | compute (ms) | exposed comm (ms) | comm (ms) | data (ms) | MiB/step | overlap | efficiency |\n";
  out += "|---|---|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    out += fmt::format("| {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.0f}% | {:.2f} |\n", p.ranks,
                       p.step_ms, p.compute_ms, p.exposed_ms, p.comm_ms, p.data_ms, p.bytes_per_step / (1 << 20),
                       100 * p.overlap, d.efficiency[i]);
  }
  out += "\n## Diagnosis\n\n";
  for (const auto& f : d.findings) out += "- " + f + "\n";
  if (!d.suggestions.empty()) {
    out += "\n## What to try\n\n";
    for (const auto& s : d.suggestions) out += "- " + s + "\n";
  }
  return out;
}

}  // namespace lockstep::cli
