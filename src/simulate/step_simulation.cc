// The step simulation; see step_simulation.h.
#include "simulate/step_simulation.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

double wire_bytes(double bytes, const std::string& hook) {
  if (hook == "none") return bytes;
  if (hook == "fp16" || hook == "bf16") return bytes / 2;
  throw InvalidArgument(fmt::format("simulate: unknown hook '{}'; use none, fp16 or bf16", hook));
}

// The calibrated 16-bit rates of the scenario's hook; null for none, or
// where the cluster has no calibration for it.
const Cluster::Hook16* hook16(const Scenario& s) {
  const Cluster::Hook16* h = s.hook == "fp16" ? &s.cluster.fp16 : s.hook == "bf16" ? &s.cluster.bf16 : nullptr;
  return h != nullptr && h->calibrated ? h : nullptr;
}

double us_per_byte(double gb_per_s) { return gb_per_s > 0 ? 1e-3 / gb_per_s : 0; }

}  // namespace

StepPrediction simulate_step(const Workload& w, const std::vector<PlannedBucket>& buckets,
                             const std::function<double(double)>& collective_ms, double straggler,
                             const CpuCosts& cpu) {
  StepPrediction p;
  p.compute_ms = w.forward_ms + w.backward_ms + w.other_ms;
  p.data_ms = w.data_ms;
  p.straggler_ms = straggler;
  // Backward's work in ms of compute, copies into the buckets included: a
  // bucket is ready once the work up to its last gradient and its own copy
  // are done.
  const double share = cpu.shared_core ? std::clamp(cpu.comm_cpu_share, 0.0, 1.0) : 0;
  const double compute_speed_shared = 1 - std::min(share, 0.5);
  const double comm_speed_shared = share > 0.5 ? 0.5 / share : 1;
  // Each bucket's all-reduce: its time alone, and its speed while backward
  // runs (its measured rate beside compute where calibrated).
  std::vector<double> ready_work, duration, speed_beside_compute;
  double copy_in_ms = 0;
  for (const auto& b : buckets) {
    copy_in_ms += b.bytes * cpu.copy_us_per_byte / 1000;
    ready_work.push_back(std::min(b.ready_ms, w.backward_ms) + copy_in_ms);
    duration.push_back(collective_ms(b.bytes));
    p.comm_ms += duration.back();
    const bool measured = cpu.shared_core && cpu.speed_beside_compute;
    speed_beside_compute.push_back(measured ? cpu.speed_beside_compute(b.bytes) : comm_speed_shared);
  }
  const double backward_work = w.backward_ms + copy_in_ms;
  double copy_back_ms = 0;
  for (const auto& b : buckets) copy_back_ms += b.bytes * cpu.copy_back_us_per_byte / 1000;
  p.copy_ms = copy_in_ms + copy_back_ms;

  // Events: a bucket ready, a collective done, backward done. Between them
  // both speeds are constant. The group runs one collective at a time, in
  // bucket order.
  double now = 0, work_done = 0, left = 0, backward_end = -1;
  std::vector<double> ready_at;  // wall time each bucket became ready
  std::size_t next = 0;
  bool running = false;
  while (next < buckets.size() || running) {
    while (ready_at.size() < buckets.size() && work_done >= ready_work[ready_at.size()]) ready_at.push_back(now);
    if (!running && next < ready_at.size()) {
      p.buckets.push_back({buckets[next].bytes, ready_at[next], now, 0});
      left = duration[next++];
      running = true;
      continue;
    }
    const bool computing = work_done < backward_work;
    const double compute_speed = !computing ? 0 : running ? compute_speed_shared : 1;
    const double comm_speed = computing && running ? speed_beside_compute[next - 1] : 1;
    // The next point backward reaches: a bucket ready, or its end.
    const double until_work = ready_at.size() < buckets.size() ? ready_work[ready_at.size()] : backward_work;
    const double to_work = compute_speed > 0 ? (until_work - work_done) / compute_speed : 1e300;
    const double to_done = running ? left / comm_speed : 1e300;
    if (to_done <= to_work) {
      now += to_done;
      work_done = std::min(until_work, work_done + to_done * compute_speed);
      running = false;
      p.buckets.back().end_ms = now;
    } else {
      now += to_work;
      work_done = until_work;
      if (running) left -= to_work * comm_speed;
    }
    if (computing && work_done >= backward_work) backward_end = now;
  }
  if (backward_end < 0) backward_end = now + (backward_work - work_done);
  p.sharing_ms = backward_end - backward_work;
  const double last_end = p.buckets.empty() ? 0 : p.buckets.back().end_ms;
  p.exposed_ms = std::max(0.0, last_end - backward_end);
  p.step_ms = p.data_ms + p.compute_ms + p.copy_ms + p.sharing_ms + p.exposed_ms + p.straggler_ms;
  return p;
}

double expected_max_of_normals(int n) {
  if (n <= 1) return 0;
  // E[max] = integral of x * n * phi(x) * Phi(x)^(n-1) dx, by the midpoint
  // rule; the integrand is negligible outside [-9, 9] for any n up to 1e9.
  // (sqrt(2 ln n), the textbook bound, is twice the answer at n = 2.)
  constexpr double kFrom = -9, kTo = 9;
  constexpr int kPoints = 18000;
  constexpr double kStep = (kTo - kFrom) / kPoints;
  const double inv_sqrt_2pi = 1 / std::sqrt(2 * std::acos(-1.0));
  double sum = 0;
  for (int i = 0; i < kPoints; ++i) {
    const double x = kFrom + (i + 0.5) * kStep;
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    if (cdf <= 0) continue;
    const double density = inv_sqrt_2pi * std::exp(-0.5 * x * x);
    sum += x * n * density * std::exp((n - 1) * std::log(cdf));
  }
  return sum * kStep;
}

double straggler_ms(double compute_ms, double jitter, int ranks) {
  if (ranks <= 1 || jitter <= 0) return 0;
  return compute_ms * jitter * expected_max_of_normals(ranks);
}

CpuCosts cpu_costs(const Scenario& s, int ranks) {
  CpuCosts cpu;
  if (ranks <= 1) return cpu;  // a world of one copies nothing and has nothing to communicate
  const Cluster& c = s.cluster;
  // After its first step the reducer copies no gradient (reducer.cc): it
  // reduces from the set of buckets backward wrote into the other set (or,
  // with bucket views, in place). A 16-bit hook narrows each bucket into
  // its own memory on the compute thread before the all-reduce.
  if (const Cluster::Hook16* h = hook16(s)) cpu.copy_us_per_byte = us_per_byte(h->narrow_gb_per_s);
  cpu.comm_cpu_share = c.comm_cpu_share;
  // A rank runs backward on one thread and its collectives on another; the
  // cores it has are those at this world size (a calibration's cores per
  // rank at 2 ranks on a host of 4 cores leaves 4 ranks there one each), as
  // for a fully sharded step.
  cpu.shared_core = without_spare_core(c, ranks);
  // The fp32 all-reduce as measured beside compute, against the idle rows
  // of the same buffers (the links' fit), where that applies
  // (beside_compute_applies); the hooks' 16-bit all-reduces, on memory of
  // their own, keep the share's rate.
  if (c.allreduce_beside_compute.calibrated && s.hook == "none" && beside_compute_applies(c, ranks)) {
    Cluster beside = c;
    beside.intra = beside.inter = c.allreduce_beside_compute.link;
    beside.gamma_us_per_byte = c.allreduce_beside_compute.gamma_us_per_byte;
    cpu.speed_beside_compute = [c, beside, ranks](double bytes) {
      const double busy = allreduce_us(beside, ranks, bytes);
      return busy > 0 ? std::min(1.0, allreduce_us(c, ranks, bytes) / busy) : 1.0;
    };
  }
  return cpu;
}

double bucket_allreduce_ms(const Scenario& s, int ranks, double bytes) {
  const double wire = wire_bytes(bytes, s.hook);
  const Cluster::Hook16* h = hook16(s);
  if (h == nullptr || ranks <= 1) {
    // Without a hook the reducer reduces out of place unless the gradients
    // are bucket views.
    if (s.bucket_view || !s.cluster.out_of_place.calibrated || ranks <= 1)
      return allreduce_us(s.cluster, ranks, wire) / 1000;
    Cluster out_of_place = s.cluster;
    out_of_place.intra = out_of_place.inter = s.cluster.out_of_place.link;
    out_of_place.gamma_us_per_byte = s.cluster.out_of_place.gamma_us_per_byte;
    return allreduce_us(out_of_place, ranks, wire) / 1000;
  }
  Cluster sixteen = s.cluster;
  sixteen.intra = sixteen.inter = h->link;
  sixteen.gamma_us_per_byte = h->gamma_us_per_byte;
  // The widening runs when the all-reduce completes, on the thread that
  // starts the next one.
  return (allreduce_us(sixteen, ranks, wire) + bytes * us_per_byte(h->widen_gb_per_s)) / 1000;
}

ScalePrediction predict(const Workload& w, const Scenario& s, int ranks) {
  if (ranks < 1) throw InvalidArgument(fmt::format("simulate: a world of {} ranks; use 1 or more", ranks));
  if (s.accumulation < 1) throw InvalidArgument("simulate: --accumulate needs 1 or more micro-batches");
  ScalePrediction out;
  out.ranks = ranks;
  out.hosts = hosts_for(s.cluster, ranks);
  const auto buckets = plan(w.gradients, s.bucket_cap_mb * (1 << 20));
  const auto collective = [&](double bytes) { return bucket_allreduce_ms(s, ranks, bytes); };
  const double compute = w.forward_ms + w.backward_ms + w.other_ms;
  const CpuCosts cpu = cpu_costs(s, ranks);
  out.step = simulate_step(w, buckets, collective, straggler_ms(compute, s.jitter, ranks), cpu);
  // More ranks on a host than cores (known from a calibration's
  // cores_per_host): they take turns on the busiest core, and a profile that
  // timed a rank's compute alone has not seen it.
  const double turns = s.cluster.cores_per_host > 0 && !w.compute_shares_cores && ranks > 1
                           ? turns_on_a_core(s.cluster, ranks)
                           : 1;
  if (turns > 1) {
    const double busy = (cpu.shared_core ? std::clamp(cpu.comm_cpu_share, 0.0, 1.0) : 0) * out.step.comm_ms;
    const double bound =
        out.step.data_ms + turns * (compute + out.step.copy_ms + busy) + out.step.straggler_ms;
    if (bound > out.step.step_ms) {
      out.step.sharing_ms += bound - out.step.step_ms;
      out.step.step_ms = bound;
    }
  }
  // Micro-batches under no_sync: forward and backward only, no waiting for
  // the others (the stragglers' delay is paid once, at the synchronised
  // one), in turns too where the ranks take turns on the cores.
  const double micro_batches = (s.accumulation - 1) * (w.forward_ms + w.backward_ms + w.data_ms);
  const double unsynchronised = turns * micro_batches;
  out.step_ms = out.step.step_ms + unsynchronised;
  const double samples = static_cast<double>(w.batch) * s.accumulation * ranks;
  out.samples_per_s = out.step_ms > 0 ? samples * 1000 / out.step_ms : 0;
  const double alone_ms = compute + w.data_ms + micro_batches;  // one rank alone takes no turns
  out.efficiency = out.step_ms > 0 ? alone_ms / out.step_ms : 1;
  // Latency's share: the same collectives on links without a per-byte cost.
  Cluster latency_only = s.cluster;
  latency_only.intra.beta_us_per_byte = latency_only.inter.beta_us_per_byte = latency_only.gamma_us_per_byte = 0;
  double latency_ms = 0;
  Scenario latency_scenario = s;
  latency_scenario.cluster = latency_only;
  latency_scenario.cluster.out_of_place.link.beta_us_per_byte = 0;
  latency_scenario.cluster.out_of_place.gamma_us_per_byte = 0;
  for (auto* h : {&latency_scenario.cluster.fp16, &latency_scenario.cluster.bf16}) {
    h->link.beta_us_per_byte = h->gamma_us_per_byte = 0;
    h->widen_gb_per_s = 0;
  }
  for (const auto& b : buckets) latency_ms += bucket_allreduce_ms(latency_scenario, ranks, b.bytes);
  out.latency_share = out.step.comm_ms > 0 ? latency_ms / out.step.comm_ms : 0;
  return out;
}

StepInterval interval_of(const std::vector<double>& steps_ms) {
  if (steps_ms.empty()) throw InvalidArgument("simulate: an interval needs at least one profile");
  std::vector<std::pair<double, std::size_t>> steps;
  for (std::size_t i = 0; i < steps_ms.size(); ++i) steps.emplace_back(steps_ms[i], i);
  std::sort(steps.begin(), steps.end());
  return {steps.front().first, steps.back().first, steps[(steps.size() - 1) / 2].second};
}

StepInterval step_interval(const std::vector<Workload>& profiles, const Scenario& s, int ranks) {
  std::vector<double> steps;
  for (const Workload& w : profiles) steps.push_back(predict(w, s, ranks).step_ms);
  return interval_of(steps);
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
  const double cpu_ms = st.copy_ms + st.sharing_ms;
  const double biggest = std::max({st.exposed_ms, st.straggler_ms, st.data_ms, cpu_ms});
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
  if (biggest == cpu_ms)
    return fmt::format(
        "Communication's CPU: {:.1f} ms of the {:.1f} ms step ({:.0f}%): the {} hook's narrowing of the buckets on "
        "the compute thread ({:.1f} ms), and backward shares its core with the collectives ({:.1f} ms: {:.1f} cores "
        "per rank, and the collectives keep a core {:.0f}% busy; a spare core per rank, or a device that moves the "
        "data itself, takes this off the step).",
        cpu_ms, step, pct(cpu_ms), s.hook, st.copy_ms, st.sharing_ms, cores_per_rank_at(s.cluster, p.ranks),
        100 * s.cluster.comm_cpu_share);
  if (biggest == st.straggler_ms)
    return fmt::format("Stragglers: with a {:.0f}% spread of compute, the slowest of {} ranks is {:.1f} ms late, "
                       "{:.0f}% of the step, and every rank waits for it.",
                       100 * s.jitter, p.ranks, st.straggler_ms, pct(st.straggler_ms));
  return fmt::format("Data loading: {:.1f} ms of the {:.1f} ms step ({:.0f}%).", st.data_ms, step, pct(st.data_ms));
}

}  // namespace lockstep::sim
