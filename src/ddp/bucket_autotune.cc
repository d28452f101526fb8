// Bucket autotuning; see bucket_autotune.h.
//
// The collective, step by step (every rank, same order):
//   1. probe: all-reduce f32 buffers of up to four sizes (the whole
//      gradient, 1/8 and 1/64 of it, and 4 KiB, within 1 KiB..64 MiB),
//      three times each; a rank keeps its fastest time per size;
//   2. one all-reduce(max) of [backward, each parameter's ready time,
//      each probe time, minus each bucket's in-step time]: the slowest
//      rank decides when a bucket can go; the fastest rank's bucket times
//      are the collectives' own (the others waited for it);
//   3. alpha/beta fitted to the probe, scaled by the in-step contention;
//      rank 0 simulates each candidate cap and broadcasts its choice (so
//      no rank can differ by rounding).
#include "ddp/bucket_autotune.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>

#include <fmt/format.h>

#include "common/clock.h"
#include "lockstep/error.h"
#include "simulate/step_simulation.h"

namespace lockstep {
namespace {

constexpr double kMiB = 1 << 20;

// Probe sizes (bytes, multiples of 4) for `total` bytes of gradients:
// three the size of buckets, which tell the per-byte cost,
// and one of 4 KiB, which is mostly latency. Without the small one a
// backend whose large-message algorithm synchronises once per chunk (shm's
// two-shot) could not tell its latency from its per-byte cost.
std::vector<double> probe_sizes(double total) {
  std::vector<double> sizes;
  for (double bytes : {total, total / 8, total / 64, 4096.0}) {
    bytes = std::clamp(bytes, 1024.0, 64 * kMiB);
    const double rounded = std::max(4.0, std::floor(bytes / 4) * 4);
    if (std::find(sizes.begin(), sizes.end(), rounded) == sizes.end()) sizes.push_back(rounded);
  }
  return sizes;
}

double predicted_exposed_ms(const std::vector<sim::Gradient>& gradients, double backward_ms,
                            const std::function<double(double)>& collective_ms, double first_bucket_bytes,
                            double cap_bytes, std::size_t* buckets = nullptr) {
  sim::Workload w;
  w.backward_ms = backward_ms;
  w.gradients = gradients;
  const auto plan = sim::plan(gradients, cap_bytes, first_bucket_bytes);
  if (buckets) *buckets = plan.size();
  return sim::simulate_step(w, plan, collective_ms).exposed_ms;
}

}  // namespace

sim::Cluster fit_allreduce_cost(const std::vector<AllreduceSample>& samples, sim::Algorithm algorithm, int world) {
  if (samples.empty()) throw InvalidArgument("fit_allreduce_cost: no all-reduce was timed");
  // Each sample: steps * alpha + wire * bytes * beta = us; divided by us
  // so that every sample weighs by its relative error.
  double aa = 0, ab = 0, bb = 0, a1 = 0, b1 = 0;
  for (const auto& s : samples) {
    const sim::CostTerms t = sim::flat_terms(algorithm, world, s.bytes);
    const double us = std::max(s.us, 1e-3);
    const double a = t.steps / us, b = t.wire * s.bytes / us;
    aa += a * a;
    ab += a * b;
    bb += b * b;
    a1 += a;
    b1 += b;
  }
  double alpha = 0, beta = 0;
  const double det = aa * bb - ab * ab;
  if (det > 1e-12 * aa * bb) {
    alpha = (a1 * bb - b1 * ab) / det;
    beta = (b1 * aa - a1 * ab) / det;
  }
  // A negative term (or samples that cannot tell the two apart): fit the
  // other term alone.
  if (alpha < 0 || beta < 0 || det <= 1e-12 * aa * bb) {
    const double only_alpha = aa > 0 ? a1 / aa : 0, only_beta = bb > 0 ? b1 / bb : 0;
    const auto error = [&](double al, double be) {
      double e = 0;
      for (const auto& s : samples) {
        const sim::CostTerms t = sim::flat_terms(algorithm, world, s.bytes);
        const double rel = (t.steps * al + t.wire * s.bytes * be) / std::max(s.us, 1e-3) - 1;
        e += rel * rel;
      }
      return e;
    };
    if (error(only_alpha, 0) <= error(0, only_beta)) {
      alpha = only_alpha;
      beta = 0;
    } else {
      alpha = 0;
      beta = only_beta;
    }
  }
  sim::Cluster c;
  c.name = "measured";
  c.ranks_per_host = world;
  c.intra = c.inter = sim::Link{alpha, beta};
  c.algorithm = algorithm;
  return c;
}

std::vector<double> candidate_caps(double total_bytes) {
  const double mib[] = {0.25, 0.5, 1, 2, 4, 8, 16, 25, 32, 64, 128, 256, 512, 1024};
  std::vector<double> out;
  for (double m : mib)
    if (m * kMiB < total_bytes) out.push_back(m * kMiB);
  out.push_back(std::max(total_bytes, 1.0));
  return out;
}

BucketCapChoice choose_bucket_cap(const std::vector<sim::Gradient>& gradients, double backward_ms,
                                  const std::function<double(double)>& collective_ms, double first_bucket_bytes,
                                  double configured_cap_bytes) {
  BucketCapChoice best;
  best.cap_bytes = configured_cap_bytes;
  best.configured_exposed_ms =
      predicted_exposed_ms(gradients, backward_ms, collective_ms, first_bucket_bytes, configured_cap_bytes, &best.buckets);
  best.exposed_ms = best.configured_exposed_ms;
  double total = 0;
  for (const auto& g : gradients) total += g.bytes;
  auto caps = candidate_caps(total);
  std::sort(caps.rbegin(), caps.rend());  // largest first: it keeps ties
  for (double cap : caps) {
    std::size_t buckets = 0;
    const double ms = predicted_exposed_ms(gradients, backward_ms, collective_ms, first_bucket_bytes, cap, &buckets);
    if (ms < best.exposed_ms * 0.99 && best.exposed_ms - ms > 0.01) {
      best.cap_bytes = cap;
      best.exposed_ms = ms;
      best.buckets = buckets;
    }
  }
  return best;
}

double contention_factor(const std::vector<AllreduceSample>& in_step, const sim::Cluster& cost, int world,
                         double wire_fraction) {
  double measured = 0, predicted = 0;
  for (const auto& b : in_step) {
    if (b.us <= 0) continue;
    measured += b.us;
    predicted += sim::allreduce_us(cost, world, b.bytes * wire_fraction);
  }
  return predicted > 0 ? std::max(1.0, measured / predicted) : 1.0;
}

BucketAutotune autotune_bucket_cap(ProcessGroup& pg, const std::vector<ParamSpec>& params,
                                   const std::vector<std::size_t>& order, const GradientTimeline& mine,
                                   const BucketPlanOptions& configured, double wire_fraction) {
  double total = 0;
  for (const auto& p : params) total += static_cast<double>(p.count * dtype_size(p.dtype));
  const std::vector<double> sizes = probe_sizes(total);

  // 1. The probe.
  std::vector<double> fastest_us(sizes.size(), std::numeric_limits<double>::infinity());
  std::vector<float> buffer(static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()) / 4));
  for (int repeat = 0; repeat < 3; ++repeat)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto count = static_cast<std::size_t>(sizes[k] / 4);
      const std::int64_t start = now_us();
      pg.allreduce(Buffer{buffer.data(), count, DType::f32}, ReduceOp::sum)->wait();
      fastest_us[k] = std::min(fastest_us[k], static_cast<double>(now_us() - start));
    }

  // 2. The slowest rank's measurements.
  std::vector<double> measured;
  measured.push_back(mine.backward_ms);
  measured.insert(measured.end(), mine.ready_ms.begin(), mine.ready_ms.end());
  measured.resize(1 + params.size(), 0.0);
  measured.insert(measured.end(), fastest_us.begin(), fastest_us.end());
  const std::size_t buckets_at = measured.size();
  for (const auto& b : mine.buckets) measured.push_back(b.us > 0 ? -b.us : -std::numeric_limits<double>::infinity());
  pg.allreduce(Buffer{measured.data(), measured.size(), DType::f64}, ReduceOp::max)->wait();

  // 3. Rank 0 decides; everyone plans with its choice.
  BucketAutotune out;
  out.configured_cap_bytes = configured.bucket_cap_bytes;
  out.backward_ms = measured[0];
  const sim::Algorithm algorithm = sim::backend_algorithm(pg.backend());
  out.algorithm = sim::to_string(algorithm);
  std::vector<AllreduceSample> samples;
  for (std::size_t k = 0; k < sizes.size(); ++k) samples.push_back({sizes[k], measured[1 + params.size() + k]});
  sim::Cluster cost = fit_allreduce_cost(samples, algorithm, pg.size());
  std::vector<AllreduceSample> in_step;
  for (std::size_t k = 0; k < mine.buckets.size(); ++k)
    if (std::isfinite(measured[buckets_at + k])) in_step.push_back({mine.buckets[k].bytes, -measured[buckets_at + k]});
  out.contention = contention_factor(in_step, cost, pg.size(), wire_fraction);
  cost.intra.alpha_us *= out.contention;
  cost.intra.beta_us_per_byte *= out.contention;
  cost.inter = cost.intra;
  out.alpha_us = cost.intra.alpha_us;
  out.beta_us_per_byte = cost.intra.beta_us_per_byte;
  double decided[3] = {0, 0, 0};  // cap, predicted exposed, configured exposed
  if (pg.rank() == 0) {
    std::vector<sim::Gradient> gradients;
    for (std::size_t i : order)
      gradients.push_back({static_cast<double>(params[i].count * dtype_size(params[i].dtype)), measured[1 + i]});
    const int world = pg.size();
    const auto collective_ms = [&](double bytes) { return sim::allreduce_us(cost, world, bytes * wire_fraction) / 1000; };
    const BucketCapChoice choice = choose_bucket_cap(gradients, out.backward_ms, collective_ms,
                                                     static_cast<double>(configured.first_bucket_bytes),
                                                     static_cast<double>(configured.bucket_cap_bytes));
    decided[0] = choice.cap_bytes;
    decided[1] = choice.exposed_ms;
    decided[2] = choice.configured_exposed_ms;
  }
  pg.broadcast(Buffer{decided, 3, DType::f64}, 0)->wait();
  out.bucket_cap_bytes = static_cast<std::size_t>(decided[0]);
  out.predicted_exposed_ms = decided[1];
  out.configured_exposed_ms = decided[2];
  return out;
}

}  // namespace lockstep
