// `lockstep simulate`; see simulate_command.h. Steps: calibrate a cluster
// from bench results when asked; build the cluster and the workload; predict
// every world size (DDP's step, or the fully sharded one beside DDP's);
// write report.md (table, bottleneck, recommendation), scaling.png and,
// with --json, the numbers.
#include "simulate/simulate_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <lockstep_option_checks/option_checks.h>
#include <nlohmann/json.hpp>

#include "common/bench_table.h"
#include "common/env.h"
#include "common/scaling_plot.h"
#include "lockstep/error.h"
#include "simulate/calibration.h"
#include "simulate/cluster_presets.h"
#include "simulate/fully_sharded_report.h"
#include "simulate/fully_sharded_workload.h"
#include "simulate/step_simulation.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

// The largest world --world-sizes takes: lockstep's largest world.
constexpr std::int64_t kMaxWorldSize = 1 << 20;

// A list of whole numbers from 1 to `max`, every item checked: std::stod
// took "nan" and "2.5" (a world of 2), and a cast to int wrapped 1e12.
std::vector<std::int64_t> parse_counts(const std::string& text, const char* what, std::int64_t max) {
  std::vector<std::int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const auto n = parse_int(item);
    if (!n || *n < 1 || *n > max)
      throw InvalidArgument(fmt::format("simulate: {} {}: '{}' is not a whole number from 1 to {}; give a list such "
                                        "as 1,2,4",
                                        what, text, item, max));
    out.push_back(*n);
  }
  if (out.empty()) throw InvalidArgument(fmt::format("simulate: {} is empty; give a list such as 1,2,4", what));
  return out;
}

// Fits the cluster to bench results, prints the fit, writes cluster.json.
// Poor fits and measurements that do not match DDP's are warned about on
// stderr, with what to do.
sim::Cluster calibrate(const SimulateOptions& o, const fs::path& dir) {
  std::vector<BenchRow> rows;
  for (const auto& path : o.calibrate) {
    const auto more = read_bench_file(path);
    rows.insert(rows.end(), more.begin(), more.end());
  }
  // Checked by CLI11 (byte_size_option) when given on the command line.
  const auto calibrate_min = option_checks::byte_size(o.calibrate_min_bytes);
  if (!o.calibrate_min_bytes.empty() && !calibrate_min)
    throw InvalidArgument(fmt::format("--calibrate-min-bytes '{}' is not a size; use {}", o.calibrate_min_bytes,
                                      option_checks::kByteSizeWords));
  const double min_bytes = calibrate_min ? static_cast<double>(*calibrate_min) : -1;
  const sim::Calibration c = sim::calibrate_cluster(rows, o.algorithm, min_bytes, o.ranks_per_host);
  const sim::Fit& fit = c.fit;
  const fs::path file = dir / "cluster.json";
  std::ofstream(file) << sim::cluster_json(c.cluster);
  std::string files;
  for (const auto& path : o.calibrate) files += (files.empty() ? "" : ", ") + path;
  std::printf("calibrated %s from %zu rows of %s (%.0f bytes and up; %zu outlier(s) left out): alpha %.2f us, beta "
              "%.3f GB/s, %s; mean error %.1f%%, max %.1f%%; %d rank(s) per host\ncluster: %s\n",
              sim::to_string(c.algorithm).c_str(), fit.rows, files.c_str(), c.min_bytes, fit.outliers,
              fit.link.alpha_us, fit.link.gb_per_s(),
              fit.gamma_separate ? fmt::format("reduction {:.3f} GB/s", 1e-3 / fit.gamma_us_per_byte).c_str()
                                 : "reduction included in beta (one ratio of reduced to sent bytes)",
              100 * fit.mean_error, 100 * fit.max_error, c.cluster.ranks_per_host, file.string().c_str());
  const sim::Cluster& cl = c.cluster;
  if (cl.copy_gb_per_s > 0 || cl.cores_per_rank > 0)
    std::printf("CPU: one rank copies %.2f GB/s, has %.2g core(s), and its all-reduces keep a core %.0f%% busy%s\n",
                cl.copy_gb_per_s, cl.cores_per_rank, 100 * cl.comm_cpu_share,
                cl.cores_per_rank > 0 && cl.cores_per_rank < 2 ? " (no spare core: they slow backward down)" : "");
  for (const auto& note : c.notes) std::printf("%s\n", note.c_str());
  std::fflush(stdout);
  for (const auto& warning : c.warnings) std::fprintf(stderr, "%s\n", warning.c_str());
  return c.cluster;
}

sim::Cluster cluster_for(const SimulateOptions& o) {
  sim::Cluster c;
  if (!o.cluster_file.empty()) {
    std::ifstream in(o.cluster_file);
    if (!in) throw ConfigError(fmt::format("simulate: cannot open the cluster file {}", o.cluster_file));
    std::stringstream text;
    text << in.rdbuf();
    c = sim::parse_cluster_json(text.str());
  } else {
    c = sim::preset(o.preset);
  }
  if (o.ranks_per_host > 0) c.ranks_per_host = o.ranks_per_host;
  if (!o.algorithm.empty()) c.algorithm = sim::parse_algorithm(o.algorithm);
  const std::string poor = sim::poor_fit_warning(c.fit_error, fmt::format("calibration in {}", o.cluster_file));
  if (!poor.empty()) std::fprintf(stderr, "%s\n", poor.c_str());
  if ((o.hook == "fp16" && !c.fp16.calibrated) || (o.hook == "bf16" && !c.bf16.calibrated))
    std::fprintf(stderr, "note: the cluster has no %s rates; the hook's all-reduce is taken as the fp32 one's on half "
                 "the bytes and its conversions as free (calibrate with a bench -d %s --json file too)\n",
                 o.hook.c_str(), o.hook == "fp16" ? "half" : "bfloat16");
  return c;
}

sim::Description description_for(const SimulateOptions& o) {
  sim::Description d;
  if (!o.layers.empty()) {
    for (const auto n : parse_counts(o.layers, "--layers", std::int64_t{1} << 50))
      d.layer_parameters.push_back(static_cast<double>(n));
  } else {
    d = sim::builtin_description(o.model.empty() ? "mlp" : o.model);
  }
  if (o.ms_per_sample > 0) d.ms_per_sample = o.ms_per_sample;
  if (o.batch > 0) d.batch = o.batch;
  return d;
}

// A profile (its compute from one run) made ready to simulate: the
// described model's gradients, the batch, the data loading.
sim::Workload finish_profile(const SimulateOptions& o, sim::Workload w) {
  if (!o.model.empty() || !o.layers.empty()) w = sim::refine_gradients(w, description_for(o));
  // A profile is of one batch size, which the files do not record.
  w.batch = o.trace_batch;
  if (o.batch > 0 && o.batch != o.trace_batch) {
    if (o.trace_batch == 0)
      throw InvalidArgument(fmt::format(
          "simulate: --batch {} with {}: a profile is of the batch it was recorded at, which the file does not say, "
          "and forward and backward grow with the batch, so this would predict the profiled batch's step. Profile "
          "at batch {} (the workflow of docs/scaling.md), or give --trace-batch B, the batch of the profile, to "
          "rescale its forward and backward linearly to {} (approximate)",
          o.batch, o.trace.empty() ? "--stats" : "--trace", o.batch, o.batch));
    w = sim::rescale_batch(w, o.batch);
  }
  if (o.data_ms >= 0) w.data_ms = o.data_ms;
  return w;
}

// The workload: a description's, or a profile's, one per --compute-trace
// (separate runs' compute) where several are given; the profile's file is
// read once.
std::vector<sim::Workload> workloads_for(const SimulateOptions& o) {
  if (o.trace.empty() && o.stats.empty()) {
    if (!o.compute_traces.empty())
      throw InvalidArgument("simulate: --compute-trace replaces the compute of a profile (--trace or --stats), and a "
                            "description has none: give --trace or --stats too, or --ms-per-sample for the "
                            "description's compute");
    return {sim::from_description(description_for(o))};
  }
  const sim::Workload measured = o.trace.empty() ? sim::from_stats(o.stats) : sim::from_trace(o.trace, o.trace_rank);
  std::vector<sim::Workload> out;
  if (o.compute_traces.empty()) out.push_back(finish_profile(o, measured));
  for (const auto& path : o.compute_traces)
    out.push_back(finish_profile(o, sim::with_compute_of(measured, sim::from_trace(path, o.trace_rank))));
  if (o.batch > 0 && o.batch != o.trace_batch)
    std::fprintf(stderr, "note: the batch-%d profile rescaled linearly to batch %d (forward, backward and the "
                 "buckets' ready times x %.3g; the rest of the step kept): approximate, a profile at batch %d is "
                 "not\n", o.trace_batch, o.batch, static_cast<double>(o.batch) / o.trace_batch, o.batch);
  return out;
}

// The cluster's CPU terms, where it has them.
std::string cpu_text(const sim::Cluster& c) {
  if (c.copy_gb_per_s <= 0 && c.cores_per_rank <= 0) return "";
  return fmt::format("; a rank copies {:.1f} GB/s and has {:.2g} core(s), its all-reduces keep a core {:.0f}% busy",
                     c.copy_gb_per_s, c.cores_per_rank, 100 * c.comm_cpu_share);
}

// `intervals`: each world size's range over the profiled runs (empty: one).
std::string render(const sim::Workload& w, const sim::Scenario& s, const std::vector<sim::ScalePrediction>& p,
                   const std::vector<sim::StepInterval>& intervals, std::size_t profiled_runs,
                   const sim::Recommendation& r) {
  std::string out = fmt::format(
      "# lockstep simulate\n\nWorkload: {} (forward {:.1f} ms, backward {:.1f} ms, rest {:.1f} ms, data {:.1f} ms; "
      "{:.1f} MiB of gradients in {} tensors; {}).\nCluster: {} ({} ranks per host, {}; inside a host "
      "{:.1f} GB/s and {:.1f} us, between hosts {:.2f} GB/s and {:.1f} us{}).\nBucket cap {} MB{}, hook {}, {} "
      "micro-batch(es) per step, compute spread {:.0f}%.\n\n",
      w.name, w.forward_ms, w.backward_ms, w.other_ms, w.data_ms, w.gradient_bytes() / (1 << 20), w.gradients.size(),
      w.batch > 0 ? fmt::format("batch {} per rank", w.batch)
                  : std::string("batch not known: give --trace-batch for samples/s"),
      s.cluster.name, s.cluster.ranks_per_host, sim::to_string(s.cluster.algorithm), s.cluster.intra.gb_per_s(),
      s.cluster.intra.alpha_us, s.cluster.inter.gb_per_s(), s.cluster.inter.alpha_us, cpu_text(s.cluster),
      s.bucket_cap_mb, s.bucket_view ? " (gradients as bucket views)" : "", s.hook,
      s.accumulation, 100 * s.jitter);
  if (!intervals.empty()) out += interval_note(profiled_runs);
  out += fmt::format("| ranks | hosts | step (ms) |{} compute (ms) | exposed comm (ms) | comm (ms) | hook narrowing "
                     "(ms) | core shared with comm (ms) | stragglers (ms) | efficiency | samples/s |\n",
                     intervals.empty() ? "" : " range over the runs (ms) |");
  out += intervals.empty() ? "|---|---|---|---|---|---|---|---|---|---|---|\n" : "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& q = p[i];
    const std::string range =
        intervals.empty() ? "" : fmt::format(" {:.1f} to {:.1f} |", intervals[i].low_ms, intervals[i].high_ms);
    out += fmt::format("| {} | {} | {:.1f} |{} {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {} |\n",
                       q.ranks, q.hosts, q.step_ms, range, q.step.compute_ms, q.step.exposed_ms, q.step.comm_ms,
                       q.step.copy_ms, q.step.sharing_ms, q.step.straggler_ms, q.efficiency,
                       w.batch > 0 ? fmt::format("{:.0f}", q.samples_per_s) : std::string("-"));
  }
  const auto& last = p.back();
  out += fmt::format("\n## Bottleneck at {} ranks\n\n{}\n\n## What to choose at {} ranks\n\n", last.ranks,
                     sim::bottleneck(w, s, last), last.ranks);
  if (r.step_ms < r.default_step_ms * 0.99)
    out += fmt::format("- Bucket cap {} MB with {} gradients: {:.1f} ms per step instead of {:.1f} ms.\n",
                       r.bucket_cap_mb >= 1e6 ? std::string("unlimited (one bucket)") : fmt::format("{:g}", r.bucket_cap_mb),
                       r.hook == "none" ? "32-bit" : r.hook + "-compressed", r.step_ms, r.default_step_ms);
  else
    out += fmt::format("- Keep bucket cap {} MB and hook {}: no other choice predicts a shorter step.\n",
                       s.bucket_cap_mb, s.hook);
  if (r.accumulation_for_90 > 1)
    out += fmt::format("- Accumulate {} micro-batches per synchronised step (no_sync) for 90% efficiency.\n",
                       r.accumulation_for_90);
  else if (r.accumulation_for_90 == 0)
    out += "- Even 64 accumulated micro-batches do not reach 90% efficiency.\n";
  return out;
}

nlohmann::json to_json(const std::vector<sim::ScalePrediction>& p, const std::vector<sim::StepInterval>& intervals,
                       std::size_t profiled_runs, const sim::Recommendation& r) {
  nlohmann::json points = nlohmann::json::array();
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto& q = p[i];
    points.push_back({{"ranks", q.ranks}, {"hosts", q.hosts}, {"step_ms", q.step_ms},
                      {"compute_ms", q.step.compute_ms}, {"exposed_ms", q.step.exposed_ms}, {"comm_ms", q.step.comm_ms},
                      {"straggler_ms", q.step.straggler_ms}, {"data_ms", q.step.data_ms},
                      {"copy_ms", q.step.copy_ms}, {"sharing_ms", q.step.sharing_ms},
                      {"efficiency", q.efficiency}, {"samples_per_s", q.samples_per_s},
                      {"buckets", q.step.buckets.size()}});
    // One profile: its step is the whole interval.
    points.back()["step_ms_low"] = intervals.empty() ? q.step_ms : intervals[i].low_ms;
    points.back()["step_ms_high"] = intervals.empty() ? q.step_ms : intervals[i].high_ms;
  }
  return {{"predictions", points},
          {"profiled_runs", profiled_runs},
          {"recommendation",
           {{"bucket_cap_mb", r.bucket_cap_mb}, {"hook", r.hook}, {"step_ms", r.step_ms},
            {"accumulation_for_90", r.accumulation_for_90}}}};
}

double element_bytes(const std::string& dtype) { return dtype == "bf16" ? 2 : 4; }

bool sharded(const SimulateOptions& o) { return o.strategy == "fsdp" || !o.sharded_traces.empty(); }

// Options of the fully sharded step given without it would change nothing.
void check_strategy(const SimulateOptions& o) {
  if (sharded(o)) {
    if (!o.compute_traces.empty() && !o.sharded_traces.empty())
      throw InvalidArgument("simulate: --compute-trace replaces the compute of a --trace or --stats profile, and "
                            "--sharded-trace is its own profile (several, comma-separated, give the interval): leave "
                            "--compute-trace out with --sharded-trace");
    if (o.accumulation > 1)
      throw InvalidArgument("simulate: --accumulate is DDP's no_sync; the fully sharded step is simulated one "
                            "synchronised micro-batch at a time: leave --accumulate out with --strategy fsdp");
    return;
  }
  const SimulateOptions defaults;
  if (o.units != defaults.units || o.prefetch != defaults.prefetch || o.no_reshard_after_forward ||
      o.param_dtype != defaults.param_dtype || o.reduce_dtype != defaults.reduce_dtype ||
      o.optimizer_bytes != defaults.optimizer_bytes)
    throw InvalidArgument("simulate: --units, --prefetch, --no-reshard-after-forward, --param-dtype, --reduce-dtype "
                          "and --optimizer-bytes describe the fully sharded step; add --strategy fsdp");
}

// The units, from each fully sharded trace or from each data-parallel
// profile's gradients (one per --compute-trace); and the data-parallel
// workloads DDP is compared on, index for index.
std::pair<std::vector<sim::ShardedWorkload>, std::vector<sim::Workload>> sharded_workloads_for(
    const SimulateOptions& o) {
  if (o.sharded_traces.empty()) {
    std::vector<sim::Workload> data_parallel = workloads_for(o);
    std::vector<sim::ShardedWorkload> units;
    for (const sim::Workload& w : data_parallel) units.push_back(sim::units_from(w, o.units));
    return {units, data_parallel};
  }
  if (o.units > 0)
    throw InvalidArgument("simulate: --units with --sharded-trace: the trace's units are the ones fully_shard made; "
                          "leave --units out");
  std::pair<std::vector<sim::ShardedWorkload>, std::vector<sim::Workload>> out;
  for (const std::string& path : o.sharded_traces) {
    sim::ShardedWorkload w = sim::sharded_from_trace(path, o.trace_rank);
    w.batch = o.trace_batch;
    if (o.data_ms >= 0) w.data_ms = o.data_ms;
    out.first.push_back(w);
    out.second.push_back(sim::as_data_parallel(w));
  }
  return out;
}

int run_sharded(const SimulateOptions& o, const sim::Scenario& s, const fs::path& dir) {
  sim::ShardingOptions sharding;
  sharding.prefetch = o.prefetch;
  sharding.reshard_after_forward = !o.no_reshard_after_forward;
  sharding.param_bytes = element_bytes(o.param_dtype);
  sharding.reduce_bytes = element_bytes(o.reduce_dtype);
  sharding.optimizer_bytes = o.optimizer_bytes;
  const auto [profiles, data_parallel] = sharded_workloads_for(o);
  const auto world_sizes = parse_counts(o.world_sizes, "--world-sizes", kMaxWorldSize);
  // As DDP's: the run whose step is the median at the largest world stands
  // for the job, every run's step gives each world size its interval.
  const auto largest = static_cast<int>(*std::max_element(world_sizes.begin(), world_sizes.end()));
  const std::size_t typical = sim::sharded_step_interval(profiles, s, sharding, largest).typical;
  const sim::ShardedWorkload& w = profiles[typical];
  std::vector<ShardedComparison> runs;
  std::vector<PlotRow> rows;
  for (const auto n : world_sizes) {
    const int ranks = static_cast<int>(n);
    runs.push_back({sim::predict_sharded(w, s, sharding, ranks), sim::predict(data_parallel[typical], s, ranks),
                    sim::sharded_step_interval(profiles, s, sharding, ranks), profiles.size()});
    const auto& q = runs.back().fsdp;
    rows.push_back({q.ranks, q.step.compute_ms, q.step.exposed_ms, q.step.data_ms, q.step.straggler_ms, q.efficiency});
  }
  const auto alternatives = sharding_alternatives(w, s, sharding, runs.back().fsdp.ranks);
  std::string report = render_sharded(w, s, sharding, runs, alternatives);
  const std::string png =
      plot_scaling(rows, dir, "lockstep simulate: predicted fully sharded step and efficiency", "stragglers");
  report += png.empty() ? "\n(No plot: gnuplot is not installed.)\n"
                        : fmt::format("\n![scaling]({})\n", fs::path(png).filename().string());
  std::ofstream(dir / "report.md") << report;
  if (!o.json.empty())
    std::ofstream(o.json) << nlohmann::json{{"strategy", "fsdp"}, {"fsdp", sharded_json(w, sharding, runs, alternatives)}}
                                 .dump(1)
                          << "\n";
  std::printf("%s\nreport: %s\n", report.c_str(), (dir / "report.md").string().c_str());
  return 0;
}

// --step-ms: what failures cost a step measured elsewhere.
int run_failures_only(const SimulateOptions& o, const sim::Scenario& s, const fs::path& dir) {
  if (!o.failures.given())
    throw InvalidArgument("simulate: --step-ms is for the failures' costs alone: give --node-mtbf-hours or "
                          "--failures-per-rank-hour too");
  if (!o.model.empty() || !o.layers.empty() || !o.trace.empty() || !o.stats.empty() || sharded(o))
    throw InvalidArgument("simulate: --step-ms replaces the workload's predicted step: leave out --model, --layers, "
                          "--trace, --stats and --strategy fsdp");
  std::vector<FailureRow> rows;
  for (const auto n : parse_counts(o.world_sizes, "--world-sizes", kMaxWorldSize))
    rows.push_back(failure_row(o.failures, static_cast<int>(n), s.cluster.ranks_per_host, o.step_ms / 1e3,
                               o.compute_share, o.state_gb * 1e9, s.cluster.inter.gb_per_s()));
  const std::string report = fmt::format("# lockstep simulate: failures\n\nA step of {:g} ms ({:.0f}% compute), "
                                         "{} rank(s) per host.\n", o.step_ms, 100 * o.compute_share,
                                         s.cluster.ranks_per_host) +
                             render_failures(o.failures, rows);
  std::ofstream(dir / "report.md") << report;
  if (!o.json.empty()) std::ofstream(o.json) << nlohmann::json{{"failures", failures_json(rows)}}.dump(1) << "\n";
  std::printf("%s\nreport: %s\n", report.c_str(), (dir / "report.md").string().c_str());
  return 0;
}

}  // namespace

void add_simulate_command(CLI::App& app, SimulateOptions& o) {
  namespace checks = option_checks;
  auto* s = app.add_subcommand("simulate", "Predict step time and scaling of a data-parallel job on another cluster");
  s->add_option("--model", o.model, "Built-in description: mlp, convnet, resnet50 (with --trace: its gradient sizes)");
  s->add_option("--layers", o.layers, "Describe a model: parameters per layer in forward order, e.g. 4194304,2048");
  s->add_option("--ms-per-sample", o.ms_per_sample, "Forward+backward time per sample of a described model")
      ->check(checks::positive_number());
  s->add_option("--batch", o.batch,
                "Samples per rank per step (with a profile: only its own batch, or with --trace-batch, rescaled)")
      ->check(checks::positive_count());
  s->add_option("--trace", o.trace, "Profile: a LOCKSTEP_TRACE file of a real run");
  s->add_option("--trace-batch", o.trace_batch, "The batch per rank the --trace or --stats profile was recorded at")
      ->check(checks::positive_count());
  s->add_option("--trace-rank", o.trace_rank, "The rank to read from a merged trace")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  s->add_option("--compute-trace", o.compute_traces,
                "Take forward/backward/rest from this trace (e.g. of N ranks under no_sync), the buckets from --trace; "
                "several (comma-separated; separate runs) give each predicted step the range over them")
      ->delimiter(',');
  s->add_option("--stats", o.stats, "Profile: a LOCKSTEP_STATS file (<prefix>.rank<r>.json)");
  s->add_option("--data-ms", o.data_ms, "Data loading per step (default: the profile's)")
      ->check(checks::non_negative_number());
  s->add_option("--preset", o.preset, "Cluster preset (--list-presets)")->capture_default_str();
  s->add_option("--cluster", o.cluster_file, "Cluster file (JSON), e.g. the cluster.json --calibrate writes");
  s->add_option("--ranks-per-host", o.ranks_per_host, "Override the cluster's ranks per host")
      ->check(checks::whole_number_in(1, kMaxWorldSize));
  s->add_option("--algorithm", o.algorithm,
                "ring, recursive_doubling, halving_doubling, one_shot, two_shot, hierarchical, tcp, shm");
  s->add_option("--calibrate", o.calibrate,
                "Fit the cluster to `lockstep bench` outputs (tables or --json files, comma-separated): fp32 for the "
                "links, -d half / -d bfloat16 (ordinary buffers) for the fp16 / bf16 hooks")
      ->delimiter(',');
  s->add_option("--calibrate-min-bytes", o.calibrate_min_bytes, "Fit rows of at least this size, e.g. 8M: the sizes of the buckets (default: the large-message algorithm's)")
      ->check(option_checks::byte_size_option());
  s->add_option("--world-sizes", o.world_sizes, "World sizes to predict")->capture_default_str();
  s->add_option("--bucket-cap-mb", o.bucket_cap_mb, "DDP bucket cap")
      ->capture_default_str()
      ->check(checks::positive_number(1 << 20));
  s->add_option("--hook", o.hook, "Gradient compression: none, fp16, bf16")->capture_default_str();
  s->add_option("--accumulate", o.accumulation, "Micro-batches per synchronised step")
      ->capture_default_str()
      ->check(checks::positive_count());
  // At most 1: the straggler model takes compute times as normal around
  // their mean, which a spread above the mean would make negative.
  auto* jitter = s->add_option("--jitter", o.jitter, "Per-rank compute spread (std/mean, 0 to 1), for stragglers, e.g. 0.05")
                     ->capture_default_str()
                     ->check(checks::number_in(0, 1));
  s->add_option("--jitter-from", o.jitter_from,
                "Measure --jitter from these LOCKSTEP_TRACE files (comma-separated; every rank's, e.g. under no_sync)")
      ->delimiter(',')
      ->excludes(jitter);
  s->add_flag("--bucket-view", o.bucket_view, "gradient_as_bucket_view (reduced in place in one set of buckets)");
  s->add_option("--strategy", o.strategy,
                "ddp, or fsdp: the fully sharded step (fully_shard, ZeRO-3) beside DDP's, with memory per rank")
      ->capture_default_str()
      ->check(CLI::IsMember({"ddp", "fsdp"}));
  s->add_option("--sharded-trace", o.sharded_traces,
                "Profile: a LOCKSTEP_TRACE file of a fully sharded run, its units' compute and parameters (fsdp); "
                "several (comma-separated; separate runs) give each predicted step the range over them")
      ->delimiter(',');
  s->add_option("--units", o.units,
                "fsdp: group the model's layers into at most this many units of about equal parameters (0: one per "
                "layer; the first is the root)")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  s->add_option("--prefetch", o.prefetch, "fsdp: all-gathers issued ahead of the unit computing")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  s->add_flag("--no-reshard-after-forward", o.no_reshard_after_forward,
              "fsdp: keep the gathered parameters from forward to backward (ZeRO-2: no all-gather in backward)");
  s->add_option("--param-dtype", o.param_dtype, "fsdp: the dtype parameters are gathered in: fp32, bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  s->add_option("--reduce-dtype", o.reduce_dtype, "fsdp: the dtype gradients are reduce-scattered in: fp32, bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16"}));
  s->add_option("--optimizer-bytes", o.optimizer_bytes,
                "fsdp: optimizer state per parameter, for memory (Adam 8, SGD with momentum 4, SGD 0)")
      ->capture_default_str()
      ->check(checks::non_negative_number());
  FailureOptions& f = o.failures;
  auto* mtbf = s->add_option("--node-mtbf-hours", f.node_mtbf_h,
                             "Predict what failures cost: a node fails every H hours on average")
                   ->check(checks::positive_number());
  s->add_option("--failures-per-rank-hour", f.failures_per_rank_hour,
                "Predict what failures cost: each rank's failure rate per hour (instead of --node-mtbf-hours)")
      ->check(checks::positive_number())
      ->excludes(mtbf);
  s->add_option("--job-hours", f.job_h, "Failures: the clean job's length")
      ->capture_default_str()
      ->check(checks::positive_number());
  s->add_option("--checkpoint-gb", f.checkpoint_gb,
                "Failures: a checkpoint's size (default: the parameters and Adam's two moments in fp32)")
      ->check(checks::positive_number());
  s->add_option("--storage-gbps", f.storage_gb_per_s, "Failures: the storage's bandwidth for checkpoints, GB/s")
      ->capture_default_str()
      ->check(checks::positive_number());
  s->add_option("--checkpoint-every", f.checkpoint_every, "Failures: steps between checkpoints (0: the best)")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  s->add_option("--restart-seconds", f.restart_s,
                "Failures: a restart's start, initialisation and rendezvous, besides reading the checkpoint")
      ->capture_default_str()
      ->check(checks::non_negative_number());
  s->add_option("--detect-seconds", f.detect_s, "Failures: in place, a death to the survivors' re-formed group")
      ->capture_default_str()
      ->check(checks::non_negative_number());
  s->add_option("--replace-seconds", f.replace_join_s,
                "Failures: a replacement's start and join, besides sending it the state over the hosts' link")
      ->capture_default_str()
      ->check(checks::non_negative_number());
  s->add_option("--shards-per-rank", f.shards_per_rank, "Failures: in place, logical shards per rank at start")
      ->capture_default_str()
      ->check(checks::positive_count());
  s->add_option("--step-after-losses", f.step_after_losses,
                "Failures: in place, the step measured with 1, 2, ... nodes lost, as multiples of the clean step "
                "(comma-separated; where ranks share cores no per-node rule holds); beyond the list, the compute "
                "share's rule")
      ->delimiter(',')
      ->check(checks::positive_number());
  s->add_option("--step-ms", o.step_ms,
                "Failures only: a measured step (ms) at every --world-sizes instead of a workload's prediction")
      ->check(checks::positive_number());
  s->add_option("--compute-share", o.compute_share, "With --step-ms: the share of the step that is compute")
      ->capture_default_str()
      ->check(checks::number_in(0, 1));
  s->add_option("--state-gb", o.state_gb,
                "With --step-ms: the parameters and optimizer state (GB), sent to a replacement and checkpointed")
      ->check(checks::non_negative_number());
  s->add_flag("--list-presets", o.list_presets, "List the cluster presets");
  s->add_option("--out", o.out, "Directory for report.md, scaling.png, cluster.json")->capture_default_str();
  s->add_option("--json", o.json, "Also write the predictions to this JSON file");
}

int run_simulate(const SimulateOptions& o) {
  if (o.list_presets) {
    for (const auto& p : sim::presets()) std::printf("%-12s %s\n", p.cluster.name.c_str(), p.description.c_str());
    return 0;
  }
  const fs::path dir(o.out);
  fs::create_directories(dir);
  sim::Scenario s;
  check_strategy(o);
  const bool has_workload =
      !o.model.empty() || !o.layers.empty() || !o.trace.empty() || !o.stats.empty() || !o.sharded_traces.empty();
  if (!o.calibrate.empty()) {
    s.cluster = calibrate(o, dir);
    if (!has_workload) return 0;
  } else {
    s.cluster = cluster_for(o);
  }
  s.bucket_cap_mb = o.bucket_cap_mb;
  s.hook = o.hook;
  s.accumulation = o.accumulation;
  s.jitter = o.jitter;
  if (!o.jitter_from.empty()) {
    s.jitter = sim::compute_jitter(o.jitter_from);
    std::printf("compute spread %.1f%% (from %zu trace file(s))\n", 100 * s.jitter, o.jitter_from.size());
  }
  s.bucket_view = o.bucket_view;
  if (o.step_ms > 0) return run_failures_only(o, s, dir);
  if (sharded(o)) {
    if (o.failures.given())
      throw InvalidArgument("simulate: --node-mtbf-hours and --failures-per-rank-hour are modelled for DDP's step: "
                            "a fully sharded job cannot yet go on in place (docs/faults.md); leave them out with "
                            "--strategy fsdp");
    return run_sharded(o, s, dir);
  }
  const auto profiles = workloads_for(o);
  const auto world_sizes = parse_counts(o.world_sizes, "--world-sizes", kMaxWorldSize);
  // The run whose step is the median at the largest world stands for the
  // job (the table, the recommendation, the failures); every run's step
  // gives each world size its interval.
  const auto largest = static_cast<int>(*std::max_element(world_sizes.begin(), world_sizes.end()));
  const sim::Workload& w = profiles[sim::step_interval(profiles, s, largest).typical];
  std::vector<sim::ScalePrediction> predictions;
  std::vector<sim::StepInterval> intervals;
  std::vector<PlotRow> rows;
  for (const auto n : world_sizes) {
    predictions.push_back(sim::predict(w, s, static_cast<int>(n)));
    if (profiles.size() > 1) intervals.push_back(sim::step_interval(profiles, s, static_cast<int>(n)));
    const auto& q = predictions.back();
    const double micro = q.step_ms - q.step.step_ms;  // the no_sync micro-batches: compute
    rows.push_back({q.ranks, q.step.compute_ms + q.step.copy_ms + q.step.sharing_ms + micro, q.step.exposed_ms, q.step.data_ms, q.step.straggler_ms, q.efficiency});
  }
  const auto rec = sim::recommend(w, s, predictions.back().ranks);
  std::string report = render(w, s, predictions, intervals, profiles.size(), rec);
  std::vector<FailureRow> failures;
  if (o.failures.given()) {
    // Parameters and Adam's two moments, fp32: a checkpoint, and what a
    // replacement receives.
    const double state_bytes = 3 * w.gradient_bytes();
    for (const auto& q : predictions)
      failures.push_back(failure_row(o.failures, q.ranks, s.cluster.ranks_per_host, q.step_ms / 1e3,
                                     q.step_ms > 0 ? q.step.compute_ms / q.step_ms : 1, state_bytes,
                                     s.cluster.inter.gb_per_s()));
    report += render_failures(o.failures, failures);
  }
  const std::string png = plot_scaling(rows, dir, "lockstep simulate: predicted step time and efficiency", "stragglers");
  report += png.empty() ? "\n(No plot: gnuplot is not installed.)\n"
                        : fmt::format("\n![scaling]({})\n", fs::path(png).filename().string());
  std::ofstream(dir / "report.md") << report;
  if (!o.json.empty()) {
    nlohmann::json out = to_json(predictions, intervals, profiles.size(), rec);
    if (!failures.empty()) out["failures"] = failures_json(failures);
    std::ofstream(o.json) << out.dump(1) << "\n";
  }
  std::printf("%s\nreport: %s\n", report.c_str(), (dir / "report.md").string().c_str());
  return 0;
}

}  // namespace lockstep::cli
