// The fully sharded strategy's report; see fully_sharded_report.h.
#include "simulate/fully_sharded_report.h"

#include <algorithm>

#include <fmt/format.h>

namespace lockstep::cli {
namespace {

constexpr double kMiB = 1 << 20;

std::string dtype_of(double bytes) { return bytes == 2 ? "bf16" : bytes == 4 ? "fp32" : fmt::format("{:g}-byte", bytes); }

std::string options_text(const sim::ShardingOptions& o) {
  return fmt::format("prefetch {}, {}, parameters gathered in {}, gradients reduced in {}, optimizer state {:g} bytes "
                     "per parameter",
                     o.prefetch,
                     o.reshard_after_forward ? "resharded after forward (ZeRO-3)"
                                             : "kept gathered from forward to backward (ZeRO-2)",
                     dtype_of(o.param_bytes), dtype_of(o.reduce_bytes), o.optimizer_bytes);
}

std::string workload_text(const sim::ShardedWorkload& w) {
  double largest = 0;
  for (const auto& u : w.units) largest = std::max(largest, u.parameters);
  return fmt::format("{} ({} units, {:.2f} M parameters: {:.1f} MiB in fp32, the largest unit {:.1f} MiB, the root "
                     "{:.1f} MiB; forward {:.1f} ms, backward {:.1f} ms, rest {:.1f} ms, data {:.1f} ms; {})",
                     w.name, w.units.size(), w.parameters() / 1e6, w.parameters() * 4 / kMiB, largest * 4 / kMiB,
                     w.units.front().parameters * 4 / kMiB, w.forward_ms(), w.backward_ms(), w.other_ms, w.data_ms,
                     w.batch > 0 ? fmt::format("batch {} per rank", w.batch)
                                 : std::string("batch not known: give --trace-batch for samples/s"));
}

std::string cluster_text(const sim::Cluster& c) {
  return fmt::format("{} ({} ranks per host, {}; inside a host {:.1f} GB/s and {:.1f} us, between hosts {:.2f} GB/s "
                     "and {:.1f} us{})",
                     c.name, c.ranks_per_host, sim::to_string(c.algorithm), c.intra.gb_per_s(), c.intra.alpha_us,
                     c.inter.gb_per_s(), c.inter.alpha_us,
                     c.allgather.calibrated || c.reduce_scatter.calibrated
                         ? "; all-gather and reduce-scatter calibrated on their own"
                         : "");
}

// Where the host's cores bound the step at `q`'s world size: how many ranks
// take turns on the busiest core, and what the step then is.
std::string cores_text(const sim::Cluster& c, const sim::ShardedScalePrediction& q) {
  if (q.step.sharing_ms <= 0) return "";
  const double turns = sim::turns_on_a_core(c, q.ranks);
  if (turns <= 1)
    return fmt::format("\n## Cores at {} ranks\n\n- No spare core: the collectives' copying runs on the compute's "
                       "core and adds {:.1f} ms to the step.\n",
                       q.ranks, q.step.sharing_ms);
  return fmt::format("\n## Cores at {} ranks\n\n- {} ranks on a host of {:g} cores: the busiest core runs {:g} of "
                     "them in turns, and every step waits for it: {:.1f} ms of the step ({:g} x a rank's compute and "
                     "the collectives' share of a core, less what the schedule above already holds). Fewer ranks "
                     "per host, or more cores, remove it.\n",
                     q.ranks, std::min(c.ranks_per_host, q.ranks), c.cores_per_host, turns, q.step.sharing_ms, turns);
}

std::string table(const std::vector<ShardedComparison>& runs, int batch) {
  const bool ranged = runs.front().profiled_runs > 1;
  std::string out = fmt::format(
      "| ranks | hosts | step (ms) |{} compute (ms) | exposed comm (ms) | forward waits (ms) | backward waits (ms) | "
      "after backward (ms) | all-gathers (ms) | reduce-scatters (ms) | stragglers (ms) | memory per rank (MiB) | "
      "efficiency | samples/s | DDP step (ms) | DDP memory (MiB) |\n"
      "|---|---|---|{}---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      ranged ? " range over the runs (ms) |" : "", ranged ? "---|" : "");
  for (const auto& r : runs) {
    const auto& q = r.fsdp;
    const auto& st = q.step;
    const std::string range = ranged ? fmt::format(" {:.1f} to {:.1f} |", r.interval.low_ms, r.interval.high_ms) : "";
    out += fmt::format(
        "| {} | {} | {:.1f} |{} {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} "
        "| {} | {:.1f} | {:.1f} |\n",
        q.ranks, q.hosts, st.step_ms, range, st.compute_ms, st.exposed_ms, st.forward_wait_ms, st.backward_wait_ms,
        st.tail_ms, st.allgather.ms, st.reduce_scatter.ms, st.straggler_ms, q.memory.total_bytes / kMiB, q.efficiency,
        batch > 0 ? fmt::format("{:.0f}", q.samples_per_s) : std::string("-"), r.ddp.step_ms,
        q.memory.ddp_bytes / kMiB);
  }
  return out;
}

std::string communication_text(const sim::ShardedScalePrediction& q) {
  const auto& st = q.step;
  const double moved = st.allgather.bus_bytes + st.reduce_scatter.bus_bytes;
  return fmt::format(
      "- {} all-gathers of {:.1f} MiB in all ({:.1f} MiB moved per rank), {:.1f} ms; {} reduce-scatters of {:.1f} "
      "MiB ({:.1f} MiB per rank), {:.1f} ms.\n- Per rank {:.1f} MiB move, {:.2f}x DDP's all-reduce of the same "
      "gradients ({:.1f} MiB per rank).\n",
      st.allgather.count, st.allgather.bytes / kMiB, st.allgather.bus_bytes / kMiB, st.allgather.ms,
      st.reduce_scatter.count, st.reduce_scatter.bytes / kMiB, st.reduce_scatter.bus_bytes / kMiB,
      st.reduce_scatter.ms, moved / kMiB, q.ddp_bus_bytes > 0 ? moved / q.ddp_bus_bytes : 0.0,
      q.ddp_bus_bytes / kMiB);
}

std::string memory_text(const sim::ShardedMemory& m) {
  return fmt::format(
      "- Shards of the fp32 parameters, gradients and optimizer state: {:.1f} MiB; parameters gathered at once: "
      "{:.1f} MiB; the largest unit's unsharded gradients: {:.1f} MiB.\n- In all {:.1f} MiB, against DDP's {:.1f} "
      "MiB ({:.0f}%).\n",
      m.sharded_bytes / kMiB, m.gathered_bytes / kMiB, m.unsharded_gradient_bytes / kMiB, m.total_bytes / kMiB,
      m.ddp_bytes / kMiB, m.ddp_bytes > 0 ? 100 * m.total_bytes / m.ddp_bytes : 0.0);
}

nlohmann::json totals_json(const sim::CollectiveTotals& t) {
  return {{"count", t.count}, {"bytes", t.bytes}, {"bus_bytes", t.bus_bytes}, {"ms", t.ms}};
}

}  // namespace

std::string interval_note(std::size_t profiled_runs) {
  // Of k+1 runs alike, each is equally likely to be the lowest, the highest
  // or any between, so a further run lands inside the range of the first k
  // with probability (k-1)/(k+1): a third for two runs, half for three.
  const double inside = (static_cast<double>(profiled_runs) - 1) / (static_cast<double>(profiled_runs) + 1);
  return fmt::format("The compute of {} profiled runs (--compute-trace or --sharded-trace files): the table is the "
                     "run whose step is the median, the range beside it the step predicted from each run's. Were "
                     "the model exact and the runs alike, a further run's step would fall inside that range with "
                     "probability {:.0f}% ((runs - 1) / (runs + 1)): a step just outside it is the machine's "
                     "spread as often as the model's miss; profile more runs for a sharper test.\n\n",
                     profiled_runs, 100 * inside);
}

std::vector<ShardingAlternative> sharding_alternatives(const sim::ShardedWorkload& w, const sim::Scenario& s,
                                                       const sim::ShardingOptions& o, int ranks) {
  std::vector<ShardingAlternative> out;
  const auto consider = [&](const std::string& change, sim::ShardingOptions changed) {
    const auto q = sim::predict_sharded(w, s, changed, ranks);
    out.push_back({change, changed, q.step.step_ms, q.memory.total_bytes});
  };
  sim::ShardingOptions more = o;
  more.prefetch += 1;
  consider(fmt::format("--prefetch {}", more.prefetch), more);
  sim::ShardingOptions flipped = o;
  flipped.reshard_after_forward = !o.reshard_after_forward;
  consider(o.reshard_after_forward ? "--no-reshard-after-forward (ZeRO-2)" : "resharding after forward (ZeRO-3)",
           flipped);
  if (o.param_bytes > 2) {
    sim::ShardingOptions half = o;
    half.param_bytes = 2;
    consider("--param-dtype bf16", half);
  }
  if (o.reduce_bytes > 2) {
    sim::ShardingOptions half = o;
    half.reduce_bytes = 2;
    consider("--reduce-dtype bf16", half);
  }
  return out;
}

std::string render_sharded(const sim::ShardedWorkload& w, const sim::Scenario& s, const sim::ShardingOptions& o,
                           const std::vector<ShardedComparison>& runs,
                           const std::vector<ShardingAlternative>& alternatives) {
  std::string out = fmt::format(
      "# lockstep simulate: fully sharded (FSDP, ZeRO-3)\n\nWorkload: {}.\nSharding: {}.\nCluster: {}.\nDDP beside "
      "it: bucket cap {} MB, hook {}{}, compute spread {:.0f}%.\n\n",
      workload_text(w), options_text(o), cluster_text(s.cluster), s.bucket_cap_mb, s.hook,
      s.bucket_view ? ", gradients as bucket views" : "", 100 * s.jitter);
  if (runs.front().profiled_runs > 1) out += interval_note(runs.front().profiled_runs);
  out += table(runs, w.batch);
  const auto& last = runs.back().fsdp;
  out += fmt::format("\n## Communication at {} ranks\n\n{}", last.ranks, communication_text(last));
  out += cores_text(s.cluster, last);
  out += fmt::format("\n## Memory per rank at {} ranks\n\n{}", last.ranks, memory_text(last.memory));
  out += fmt::format("\n## What to choose at {} ranks\n\n", last.ranks);
  bool any = false;
  for (const auto& a : alternatives) {
    if (a.step_ms >= last.step.step_ms * 0.99) continue;
    any = true;
    out += fmt::format("- {}: {:.1f} ms per step instead of {:.1f} ms, {:.1f} MiB per rank instead of {:.1f}.\n",
                       a.change, a.step_ms, last.step.step_ms, a.memory_bytes / kMiB, last.memory.total_bytes / kMiB);
  }
  if (!any) out += "- Keep these options: no single change predicts a step 1% shorter.\n";
  return out;
}

nlohmann::json sharded_json(const sim::ShardedWorkload& w, const sim::ShardingOptions& o,
                            const std::vector<ShardedComparison>& runs,
                            const std::vector<ShardingAlternative>& alternatives) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& u : w.units)
    units.push_back({{"parameters", u.parameters}, {"forward_ms", u.forward_ms}, {"backward_ms", u.backward_ms}});
  nlohmann::json points = nlohmann::json::array();
  for (const auto& r : runs) {
    const auto& q = r.fsdp;
    const auto& st = q.step;
    const auto& m = q.memory;
    points.push_back({{"ranks", q.ranks}, {"hosts", q.hosts}, {"step_ms", st.step_ms},
                      {"compute_ms", st.compute_ms}, {"exposed_ms", st.exposed_ms},
                      {"forward_wait_ms", st.forward_wait_ms}, {"backward_wait_ms", st.backward_wait_ms},
                      {"tail_ms", st.tail_ms}, {"comm_ms", st.comm_ms}, {"straggler_ms", st.straggler_ms},
                      {"sharing_ms", st.sharing_ms},
                      {"data_ms", st.data_ms}, {"allgather", totals_json(st.allgather)},
                      {"reduce_scatter", totals_json(st.reduce_scatter)},
                      {"memory",
                       {{"sharded_bytes", m.sharded_bytes}, {"gathered_bytes", m.gathered_bytes},
                        {"unsharded_gradient_bytes", m.unsharded_gradient_bytes}, {"total_bytes", m.total_bytes},
                        {"ddp_bytes", m.ddp_bytes}}},
                      {"ddp_bus_bytes", q.ddp_bus_bytes}, {"ddp_step_ms", r.ddp.step_ms},
                      {"efficiency", q.efficiency}, {"samples_per_s", q.samples_per_s},
                      {"step_ms_low", r.interval.low_ms}, {"step_ms_high", r.interval.high_ms}});
  }
  nlohmann::json choices = nlohmann::json::array();
  for (const auto& a : alternatives)
    choices.push_back({{"change", a.change}, {"step_ms", a.step_ms}, {"memory_bytes", a.memory_bytes}});
  return {{"units", units},
          {"profiled_runs", runs.front().profiled_runs},
          {"options",
           {{"prefetch", o.prefetch}, {"reshard_after_forward", o.reshard_after_forward},
            {"param_dtype", dtype_of(o.param_bytes)}, {"reduce_dtype", dtype_of(o.reduce_bytes)},
            {"optimizer_bytes", o.optimizer_bytes}}},
          {"predictions", points},
          {"alternatives", choices}};
}

}  // namespace lockstep::cli
