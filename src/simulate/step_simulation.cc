// The step simulation; see step_simulation.h.
#include "simulate/step_simulation.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

int hosts_for(const Cluster& c, int ranks) {
  const int per_host = std::max(1, std::min(c.ranks_per_host, ranks));
  return (ranks + per_host - 1) / per_host;
}

double wire_bytes(double bytes, const std::string& hook) {
  if (hook == "none") return bytes;
  if (hook == "fp16" || hook == "bf16") return bytes / 2;
  throw InvalidArgument(fmt::format("simulate: unknown hook '{}'; use none, fp16 or bf16", hook));
}

}  // namespace

StepPrediction simulate_step(const Workload& w, const std::vector<PlannedBucket>& buckets,
                             const std::function<double(double)>& collective_ms, double straggler) {
  StepPrediction p;
  p.compute_ms = w.forward_ms + w.backward_ms + w.other_ms;
  p.data_ms = w.data_ms;
  p.straggler_ms = straggler;
  double group_free_ms = 0;  // the group runs one collective at a time, in order
  for (const auto& b : buckets) {
    BucketTiming t{b.bytes, b.ready_ms, std::max(b.ready_ms, group_free_ms), 0};
    const double ms = collective_ms(b.bytes);
    t.end_ms = t.start_ms + ms;
    group_free_ms = t.end_ms;
    p.comm_ms += ms;
    p.buckets.push_back(t);
  }
  p.exposed_ms = std::max(0.0, group_free_ms - w.backward_ms);
  p.step_ms = p.data_ms + p.compute_ms + p.exposed_ms + p.straggler_ms;
  return p;
}

double straggler_ms(double compute_ms, double jitter, int ranks) {
  if (ranks <= 1 || jitter <= 0) return 0;
  return compute_ms * jitter * std::sqrt(2 * std::log(static_cast<double>(ranks)));
}

ScalePrediction predict(const Workload& w, const Scenario& s, int ranks) {
  if (ranks < 1) throw InvalidArgument(fmt::format("simulate: a world of {} ranks; use 1 or more", ranks));
  if (s.accumulation < 1) throw InvalidArgument("simulate: --accumulate needs 1 or more micro-batches");
  ScalePrediction out;
  out.ranks = ranks;
  out.hosts = hosts_for(s.cluster, ranks);
  const auto buckets = plan(w.gradients, s.bucket_cap_mb * (1 << 20));
  const auto collective = [&](double bytes) { return allreduce_us(s.cluster, ranks, wire_bytes(bytes, s.hook)) / 1000; };
  const double compute = w.forward_ms + w.backward_ms + w.other_ms;
  out.step = simulate_step(w, buckets, collective, straggler_ms(compute, s.jitter, ranks));
  // Micro-batches under no_sync: forward and backward only, no waiting for
  // the others (the stragglers' delay is paid once, at the synchronised one).
  const double unsynchronised = (s.accumulation - 1) * (w.forward_ms + w.backward_ms + w.data_ms);
  out.step_ms = out.step.step_ms + unsynchronised;
  const double samples = static_cast<double>(w.batch) * s.accumulation * ranks;
  out.samples_per_s = out.step_ms > 0 ? samples * 1000 / out.step_ms : 0;
  const double alone_ms = compute + w.data_ms + unsynchronised;
  out.efficiency = out.step_ms > 0 ? alone_ms / out.step_ms : 1;
  // Latency's share: the same collectives on links without a per-byte cost.
  Cluster latency_only = s.cluster;
  latency_only.intra.beta_us_per_byte = latency_only.inter.beta_us_per_byte = latency_only.gamma_us_per_byte = 0;
  double latency_ms = 0;
  for (const auto& b : buckets) latency_ms += allreduce_us(latency_only, ranks, wire_bytes(b.bytes, s.hook)) / 1000;
  out.latency_share = out.step.comm_ms > 0 ? latency_ms / out.step.comm_ms : 0;
  return out;
}

Recommendation recommend(const Workload& w, const Scenario& s, int ranks) {
  Recommendation r;
  Scenario one = s;
  one.accumulation = 1;
  r.default_step_ms = predict(w, one, ranks).step_ms;
  r.step_ms = r.default_step_ms;
  r.bucket_cap_mb = s.bucket_cap_mb;
  r.hook = s.hook;
  // A choice must beat the current one by 1% to replace it, so that caps
  // that plan the same buckets do not displace the one asked for.
  const double caps[] = {0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 200, 400, 1e6};
  for (const char* hook : {"none", "bf16"})
    for (double cap : caps) {
      Scenario t = one;
      t.bucket_cap_mb = cap;
      t.hook = hook;
      const double ms = predict(w, t, ranks).step_ms;
      if (ms < r.step_ms * 0.99) {
        r.step_ms = ms;
        r.bucket_cap_mb = cap;
        r.hook = hook;
      }
    }
  for (int k = 1; k <= 64; k *= 2) {
    Scenario t = s;
    t.accumulation = k;
    if (predict(w, t, ranks).efficiency >= 0.9) {
      r.accumulation_for_90 = k;
      break;
    }
  }
  return r;
}

std::string bottleneck(const Workload& w, const Scenario& s, const ScalePrediction& p) {
  const auto& st = p.step;
  const double step = p.step.step_ms;
  const auto pct = [&](double part) { return step > 0 ? 100 * part / step : 0; };
  if (p.ranks <= 1) return "One rank: nothing to communicate; the step is compute.";
  const double biggest = std::max({st.exposed_ms, st.straggler_ms, st.data_ms});
  if (biggest < 0.1 * step)
    return fmt::format("Compute: {:.0f}% of the {:.1f} ms step; communication ({:.1f} ms) hides behind backward.",
                       pct(st.compute_ms), step, st.comm_ms);
  if (biggest == st.exposed_ms) {
    const std::string link = p.hosts > 1 ? "between hosts" : "inside the host";
    const Link& l = p.hosts > 1 ? s.cluster.inter : s.cluster.intra;
    return fmt::format(
        "Communication: {:.1f} ms of the {:.1f} ms step ({:.0f}%) waits for gradient all-reduces that backward "
        "({:.1f} ms) cannot hide. They take {:.1f} ms in all for {:.1f} MiB over {} ranks ({} ({}) {}, {:.1f} GB/s, "
        "{:.1f} us per message); {:.0f}% of it is per-message latency, {:.0f}% bandwidth and reduction.",
        st.exposed_ms, step, pct(st.exposed_ms), w.backward_ms, st.comm_ms, w.gradient_bytes() / (1 << 20), p.ranks,
        to_string(s.cluster.algorithm), s.cluster.name, link, l.gb_per_s(), l.alpha_us, 100 * p.latency_share,
        100 * (1 - p.latency_share));
  }
  if (biggest == st.straggler_ms)
    return fmt::format("Stragglers: with a {:.0f}% spread of compute, the slowest of {} ranks is {:.1f} ms late, "
                       "{:.0f}% of the step, and every rank waits for it.",
                       100 * s.jitter, p.ranks, st.straggler_ms, pct(st.straggler_ms));
  return fmt::format("Data loading: {:.1f} ms of the {:.1f} ms step ({:.0f}%).", st.data_ms, step, pct(st.data_ms));
}

}  // namespace lockstep::sim
