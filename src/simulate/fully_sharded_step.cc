// The fully sharded step; see fully_sharded_step.h.
#include "simulate/fully_sharded_step.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

void check_sharding(const ShardedWorkload& w, int ranks, const ShardingOptions& o) {
  if (w.units.empty()) throw InvalidArgument("simulate: a fully sharded workload needs at least one unit");
  if (ranks < 1) throw InvalidArgument(fmt::format("simulate: a world of {} ranks; use 1 or more", ranks));
  if (o.prefetch < 0 || o.param_bytes <= 0 || o.reduce_bytes <= 0 || o.optimizer_bytes < 0)
    throw InvalidArgument(fmt::format("simulate: prefetch {}, parameter bytes {}, reduction bytes {}, optimizer bytes "
                                      "{}: the prefetch and optimizer state must not be negative, the element sizes "
                                      "must be positive",
                                      o.prefetch, o.param_bytes, o.reduce_bytes, o.optimizer_bytes));
}

// The communication stream: collectives run one at a time in the order
// they were issued. The compute thread issues them, so issue times never
// go back and each collective starts when it is issued or when the one
// before it ends, whichever is later.
class CommStream {
 public:
  CommStream(std::vector<ShardedCollectiveTiming>& log, const ShardedCollectiveTimes& times)
      : log_(log), times_(times) {}

  // Returns the collective's index in the log.
  int issue(ShardedCollective kind, int unit, bool backward, double bytes, double now, bool beside_compute) {
    const bool gather = kind == ShardedCollective::allgather;
    const auto& alone = gather ? times_.allgather_ms : times_.reduce_scatter_ms;
    const auto& beside = gather ? times_.allgather_beside_compute_ms : times_.reduce_scatter_beside_compute_ms;
    const double ms = beside_compute && beside ? beside(bytes) : alone(bytes);
    const double start = std::max(now, free_ms_);
    free_ms_ = start + ms;
    log_.push_back({kind, unit, backward, bytes, now, start, free_ms_, beside_compute});
    return static_cast<int>(log_.size()) - 1;
  }
  double end_of(int index) const { return log_[static_cast<std::size_t>(index)].end_ms; }
  double free_ms() const { return free_ms_; }

 private:
  std::vector<ShardedCollectiveTiming>& log_;
  const ShardedCollectiveTimes& times_;
  double free_ms_ = 0;
};

CollectiveTotals collective_totals(const std::vector<ShardedCollectiveTiming>& log, ShardedCollective kind, int ranks) {
  CollectiveTotals t;
  for (const auto& c : log) {
    if (c.kind != kind) continue;
    ++t.count;
    t.bytes += c.bytes;
    t.ms += c.end_ms - c.start_ms;
  }
  t.bus_bytes = kind == ShardedCollective::allgather ? allgather_bus_bytes(ranks, t.bytes)
                                                     : reduce_scatter_bus_bytes(ranks, t.bytes);
  return t;
}

}  // namespace

const char* to_string(ShardedCollective c) {
  return c == ShardedCollective::allgather ? "allgather" : "reduce_scatter";
}

double shard_elements(double parameters, int ranks) { return std::ceil(parameters / ranks); }

// Steps: forward over the units in order, then backward in reverse, on one
// clock of the compute thread; before each unit computes, the collectives
// its hook issues go onto the stream and the unit waits for its own
// all-gather; after its backward its reduce-scatter goes on. The step ends
// when backward has ended and the stream is empty. A gather for a later
// unit than the one about to compute (a prefetch) runs beside compute, the
// unit's own gather (nothing computes until it ends) does not; every
// reduce-scatter but the last unit's runs beside the backward left.
ShardedStepPrediction simulate_sharded_step(const ShardedWorkload& w, int ranks, const ShardingOptions& o,
                                            const ShardedCollectiveTimes& times, double straggler) {
  check_sharding(w, ranks, o);
  ShardedStepPrediction p;
  CommStream stream(p.collectives, times);
  const int units = static_cast<int>(w.units.size());
  const auto padded = [&](int k) { return shard_elements(w.units[k].parameters, ranks) * ranks; };
  const auto has_parameters = [&](int k) { return w.units[k].parameters > 0; };
  const auto gather = [&](int k, bool backward, double now, bool prefetched) {
    return stream.issue(ShardedCollective::allgather, k, backward, padded(k) * o.param_bytes, now, prefetched);
  };
  double now = 0;

  std::vector<int> forward_gather(units, -1);
  for (int k = 0, next = 0; k < units; ++k) {
    for (; next < units && next <= k + o.prefetch; ++next)
      if (has_parameters(next)) forward_gather[next] = gather(next, false, now, next > k);
    if (forward_gather[k] >= 0) {
      p.forward_wait_ms += std::max(0.0, stream.end_of(forward_gather[k]) - now);
      now = std::max(now, stream.end_of(forward_gather[k]));
    }
    now += w.units[k].forward_ms;
  }

  // Backward visits units[units - 1 - i] at position i.
  const auto gathered_again = [&](int k) { return o.reshard_after_forward && k != 0 && has_parameters(k); };
  std::vector<int> backward_gather(units, -1);
  for (int i = 0, next = 0; i < units; ++i) {
    const int k = units - 1 - i;
    for (; next < units && next <= i + o.prefetch; ++next)
      if (gathered_again(units - 1 - next))
        backward_gather[units - 1 - next] = gather(units - 1 - next, true, now, next > i);
    if (backward_gather[k] >= 0) {
      p.backward_wait_ms += std::max(0.0, stream.end_of(backward_gather[k]) - now);
      now = std::max(now, stream.end_of(backward_gather[k]));
    }
    now += w.units[k].backward_ms;
    if (has_parameters(k))
      stream.issue(ShardedCollective::reduce_scatter, k, true, padded(k) * o.reduce_bytes, now, i + 1 < units);
  }
  p.tail_ms = std::max(0.0, stream.free_ms() - now);

  p.allgather = collective_totals(p.collectives, ShardedCollective::allgather, ranks);
  p.reduce_scatter = collective_totals(p.collectives, ShardedCollective::reduce_scatter, ranks);
  p.comm_ms = p.allgather.ms + p.reduce_scatter.ms;
  p.compute_ms = w.forward_ms() + w.backward_ms() + w.other_ms;
  p.exposed_ms = p.forward_wait_ms + p.backward_wait_ms + p.tail_ms;
  p.data_ms = w.data_ms;
  p.straggler_ms = straggler;
  p.step_ms = p.data_ms + p.compute_ms + p.exposed_ms + p.straggler_ms;
  return p;
}

ShardedMemory sharded_memory(const ShardedWorkload& w, int ranks, const ShardingOptions& o, bool ddp_bucket_view) {
  check_sharding(w, ranks, o);
  constexpr double kFp32 = 4;
  ShardedMemory m;
  std::vector<double> others;  // the gathered sizes of the units besides the root
  double shards = 0, all_gathered = 0, largest = 0;
  for (std::size_t k = 0; k < w.units.size(); ++k) {
    const double gathered = shard_elements(w.units[k].parameters, ranks) * ranks;
    shards += gathered / ranks;
    all_gathered += gathered;
    largest = std::max(largest, gathered);
    if (k > 0) others.push_back(gathered);
  }
  m.sharded_bytes = shards * (kFp32 + kFp32 + o.optimizer_bytes);
  double gathered = all_gathered;
  if (o.reshard_after_forward) {
    // The root stays gathered; of the others, the one computing and the
    // ones prefetched, taken as the largest.
    std::sort(others.rbegin(), others.rend());
    const std::size_t at_once = std::min(others.size(), static_cast<std::size_t>(o.prefetch) + 1);
    gathered = shard_elements(w.units[0].parameters, ranks) * ranks;
    for (std::size_t i = 0; i < at_once; ++i) gathered += others[i];
  }
  m.gathered_bytes = gathered * o.param_bytes;
  m.unsharded_gradient_bytes = largest * o.reduce_bytes;
  m.total_bytes = m.sharded_bytes + m.gathered_bytes + m.unsharded_gradient_bytes;
  const double parameters = w.parameters();
  m.ddp_bytes = parameters * (kFp32 + kFp32 + o.optimizer_bytes) + (ddp_bucket_view ? 0 : parameters * kFp32);
  return m;
}

ShardedScalePrediction predict_sharded(const ShardedWorkload& w, const Scenario& s, const ShardingOptions& o,
                                       int ranks) {
  ShardedScalePrediction out;
  out.ranks = ranks;
  out.hosts = hosts_for(s.cluster, ranks);
  const Cluster& c = s.cluster;
  // Without a spare core a collective beside compute competes with it for
  // the core: where calibrated so (bench --busy), it takes that rate, where
  // that applies (beside_compute_applies).
  const Cluster beside = beside_compute(c);
  const auto at = [ranks](const Cluster& cluster, double (*us)(const Cluster&, int, double)) {
    return [&cluster, ranks, us](double bytes) { return us(cluster, ranks, bytes) / 1000; };
  };
  ShardedCollectiveTimes times{at(c, allgather_us), at(c, reduce_scatter_us), nullptr, nullptr};
  if (beside_compute_applies(c, ranks)) {
    times.allgather_beside_compute_ms = at(beside, allgather_us);
    times.reduce_scatter_beside_compute_ms = at(beside, reduce_scatter_us);
  }
  const double compute = w.forward_ms() + w.backward_ms() + w.other_ms;
  out.step = simulate_sharded_step(w, ranks, o, times, straggler_ms(compute, s.jitter, ranks));
  // Without a spare core the group's thread copies on the compute thread's
  // core: what overlaps in the schedule above costs compute time instead.
  // As DDP's model charges it (step_simulation.cc): the collectives keep a
  // core comm_cpu_share busy for as long as they run, beside compute their
  // longer time (the shm backend spins while a peer's core computes). With
  // less than a core a rank, the ranks of a core take turns: its step is
  // their work together. (A fully sharded trace times each unit's own
  // compute, so the turns are not in the profile; a --compute-trace of N
  // ranks has them already.)
  if (without_spare_core(c, ranks)) {
    const double busy = std::clamp(c.comm_cpu_share, 0.0, 1.0) * out.step.comm_ms;
    const double turns = w.compute_shares_cores ? 1 : turns_on_a_core(c, ranks);
    const double bound = out.step.data_ms + (compute + busy) * turns + out.step.straggler_ms;
    if (bound > out.step.step_ms) {
      out.step.sharing_ms = bound - out.step.step_ms;
      out.step.step_ms = bound;
    }
  }
  out.memory = sharded_memory(w, ranks, o, s.bucket_view);
  out.ddp_bus_bytes = allreduce_bus_bytes(ranks, w.parameters() * 4);
  const double samples = static_cast<double>(w.batch) * ranks;
  out.samples_per_s = out.step.step_ms > 0 ? samples * 1000 / out.step.step_ms : 0;
  out.efficiency = out.step.step_ms > 0 ? (compute + w.data_ms) / out.step.step_ms : 1;
  return out;
}

StepInterval sharded_step_interval(const std::vector<ShardedWorkload>& profiles, const Scenario& s,
                                   const ShardingOptions& o, int ranks) {
  std::vector<double> steps;
  for (const ShardedWorkload& w : profiles) steps.push_back(predict_sharded(w, s, o, ranks).step.step_ms);
  return interval_of(steps);
}

}  // namespace lockstep::sim
