// Workloads; see workload.h.
#include "simulate/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

nlohmann::json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("simulate: cannot open the {} file {}", what, path));
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("simulate: {} is not a {} file ({})", path, what, e.what()));
  }
}

struct TraceEvent {
  std::string name;
  double start_ms = 0;
  double ms = 0;
  double end_ms() const { return start_ms + ms; }
};

// The step and bucket tracks of one rank, in time order.
void read_tracks(const nlohmann::json& doc, int rank, std::vector<TraceEvent>& step, std::vector<TraceEvent>& buckets) {
  if (!doc.is_object() || !doc.contains("traceEvents")) return;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X" || e.value("pid", -1) != rank) continue;
    const std::string track = e.value("cat", "");
    TraceEvent ev{e.value("name", ""), e.value("ts", 0.0) / 1000, e.value("dur", 0.0) / 1000};
    if (track == "step") step.push_back(ev);
    if (track == "buckets") buckets.push_back(ev);
  }
  const auto by_start = [](const TraceEvent& a, const TraceEvent& b) { return a.start_ms < b.start_ms; };
  std::sort(step.begin(), step.end(), by_start);
  std::sort(buckets.begin(), buckets.end(), by_start);
}

const TraceEvent* next_named(const std::vector<TraceEvent>& events, std::size_t from, const std::string& prefix) {
  for (std::size_t i = from; i < events.size(); ++i) {
    if (events[i].name == "forward" && i != from && prefix != "forward") return nullptr;  // the next step began
    if (events[i].name.rfind(prefix, 0) == 0) return &events[i];
  }
  return nullptr;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Linear interpolation of the time at which `bytes` of gradients are ready,
// on the curve through (0, 0) and each measured gradient's (cumulative
// bytes, ready time).
double ready_at(const std::vector<Gradient>& measured, double bytes) {
  double before_bytes = 0, before_ms = 0;
  for (const auto& g : measured) {
    const double after_bytes = before_bytes + g.bytes;
    if (bytes <= after_bytes) {
      const double f = g.bytes > 0 ? (bytes - before_bytes) / g.bytes : 1;
      return before_ms + f * (g.ready_ms - before_ms);
    }
    before_bytes = after_bytes;
    before_ms = std::max(before_ms, g.ready_ms);
  }
  return before_ms;
}

}  // namespace

double Workload::gradient_bytes() const {
  return std::accumulate(gradients.begin(), gradients.end(), 0.0,
                         [](double sum, const Gradient& g) { return sum + g.bytes; });
}

Workload from_description(const Description& d) {
  if (d.layer_parameters.empty()) throw InvalidArgument("simulate: the model description lists no layers");
  if (!d.layer_compute.empty() && d.layer_compute.size() != d.layer_parameters.size())
    throw InvalidArgument(fmt::format("simulate: {} layers but {} compute shares; give one per layer or none",
                                      d.layer_parameters.size(), d.layer_compute.size()));
  Workload w;
  w.name = d.name;
  w.batch = d.batch;
  const double compute = d.ms_per_sample * d.batch;
  w.forward_ms = (1 - d.backward_share) * compute;
  w.backward_ms = d.backward_share * compute;
  w.other_ms = d.other_ms;
  const auto& weights = d.layer_compute.empty() ? d.layer_parameters : d.layer_compute;
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  // Backward visits the layers last to first; a layer's gradient is ready
  // once its share of backward is done.
  double done = 0;
  for (std::size_t i = d.layer_parameters.size(); i-- > 0;) {
    done += weights[i];
    w.gradients.push_back({d.layer_parameters[i] * d.bytes_per_parameter, total > 0 ? w.backward_ms * done / total : 0});
  }
  return w;
}

Description builtin_description(const std::string& model) {
  Description d;
  d.name = model;
  if (model == "mlp") {  // 6 x Linear(2048, 2048): weight and bias tensors
    for (int i = 0; i < 6; ++i) {
      d.layer_parameters.insert(d.layer_parameters.end(), {2048.0 * 2048, 2048});
      d.layer_compute.insert(d.layer_compute.end(), {1, 0});
    }
    d.ms_per_sample = 1.75;  // measured on the 2-core machine of docs/performance.md
    d.batch = 64;
  } else if (model == "convnet") {  // Conv 1->32->64 (3x3), Linear 9216->128->10
    d.layer_parameters = {288, 32, 18432, 64, 1179648, 128, 1280, 10};
    // Multiply-adds per sample of each layer (the convolutions dominate).
    d.layer_compute = {26.0 * 26 * 32 * 9, 0, 24.0 * 24 * 64 * 32 * 9, 0, 9216.0 * 128, 0, 1280, 0};
    d.ms_per_sample = 0.3;
    d.batch = 64;
  } else if (model == "resnet50") {
    // Per residual block: stage parameters split over its blocks, compute in
    // multiply-adds per stage (He et al. 2016; torchvision's resnet50).
    struct Stage {
      int blocks;
      double parameters, gmacs;
    };
    const Stage stages[] = {{1, 9536, 0.118}, {3, 215808, 0.680}, {4, 1219584, 1.030},
                            {6, 7098368, 1.469}, {3, 14964736, 0.811}, {1, 2049000, 0.002}};
    for (const auto& s : stages)
      for (int b = 0; b < s.blocks; ++b) {
        d.layer_parameters.push_back(s.parameters / s.blocks);
        d.layer_compute.push_back(s.gmacs / s.blocks);
      }
    d.ms_per_sample = 0.4;  // ~2,500 images/s on one A100 with mixed precision
    d.batch = 256;
  } else {
    throw InvalidArgument(fmt::format("simulate: unknown model '{}'; built in are mlp, convnet and resnet50, or "
                                      "describe one with --layers and --ms-per-sample",
                                      model));
  }
  return d;
}

double compute_jitter(const std::vector<std::string>& paths, int skip) {
  std::vector<double> steps;
  for (const auto& path : paths) {
    const nlohmann::json doc = read_json(path, "LOCKSTEP_TRACE");
    std::map<int, std::vector<double>> forward_starts;  // process -> ms
    if (doc.is_object() && doc.contains("traceEvents"))
      for (const auto& e : doc["traceEvents"])
        if (e.value("ph", "") == "X" && e.value("name", "") == "forward")
          forward_starts[e.value("pid", -1)].push_back(e.value("ts", 0.0) / 1000);
    for (auto& [pid, starts] : forward_starts) {
      std::sort(starts.begin(), starts.end());
      for (std::size_t i = static_cast<std::size_t>(skip) + 1; i < starts.size(); ++i)
        steps.push_back(starts[i] - starts[i - 1]);
    }
  }
  if (steps.size() < 4)
    throw Error(fmt::format("simulate: {} step(s) in the traces for the compute spread; trace N ranks for at least {} "
                            "steps each (e.g. under no_sync) and give every rank's file",
                            steps.size(), skip + 4));
  const double middle = median(steps);
  std::vector<double> deviation;
  for (double t : steps) deviation.push_back(std::abs(t - middle));
  return middle > 0 ? 1.4826 * median(deviation) / middle : 0;
}

Workload from_trace(const std::string& path, int rank, int skip) {
  std::vector<TraceEvent> step, buckets;
  read_tracks(read_json(path, "LOCKSTEP_TRACE"), rank, step, buckets);
  // Per step; medians, so that a step disturbed by something else on the
  // machine does not move the profile.
  std::vector<double> forward, backward, other;
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> bucket;  // index -> (MiB, ready ms)
  int seen = 0;
  for (std::size_t i = 0; i < step.size(); ++i) {
    if (step[i].name != "forward") continue;
    const TraceEvent* b = next_named(step, i, "backward");
    const TraceEvent* between = next_named(step, i, "between steps");
    const TraceEvent* wait = next_named(step, i, "wait for gradients");
    const TraceEvent* next = nullptr;
    for (std::size_t j = i + 1; j < step.size() && !next; ++j)
      if (step[j].name == "forward") next = &step[j];
    if (b && between) {
      if (seen++ < skip) continue;
      forward.push_back(step[i].ms);
      backward.push_back(b->ms);
      other.push_back(between->ms);
    } else if (next) {
      // Under no_sync backward is not timed (and "between steps" is
      // missing): backward stays 0 and the rest is everything up to the
      // next forward; with_compute_of splits it.
      if (seen++ < skip) continue;
      forward.push_back(step[i].ms);
      backward.push_back(0);
      other.push_back(std::max(0.0, next->start_ms - step[i].end_ms()));
      continue;
    } else {
      continue;
    }
    const double end = wait ? wait->end_ms() : b->end_ms();
    for (const auto& e : buckets) {
      if (e.start_ms < b->start_ms || e.start_ms > end) continue;
      int index = 0;
      double mib = 0;
      if (std::sscanf(e.name.c_str(), "bucket %d (%lf MiB)", &index, &mib) != 2) continue;
      bucket[index].first.push_back(mib);
      bucket[index].second.push_back(e.start_ms - b->start_ms);
    }
  }
  if (forward.empty())
    throw Error(fmt::format("simulate: {} holds no complete DDP step of rank {} after {} warm-up steps; trace a run of "
                            "at least {} steps with LOCKSTEP_TRACE set",
                            path, rank, skip, skip + 2));
  Workload w;
  w.name = path;
  w.forward_ms = median(forward);
  w.backward_ms = median(backward);
  w.other_ms = median(other);
  for (const auto& [index, values] : bucket)
    w.gradients.push_back({median(values.first) * (1 << 20), std::min(w.backward_ms, median(values.second))});
  return w;
}

Workload with_compute_of(const Workload& timeline, const Workload& compute) {
  Workload w = timeline;
  double backward = compute.backward_ms, other = compute.other_ms;
  if (backward <= 0) {  // an untimed (no_sync) backward: split as the timeline does
    const double after_forward = timeline.backward_ms + timeline.other_ms;
    backward = after_forward > 0 ? other * timeline.backward_ms / after_forward : 0;
    other -= backward;
  }
  const double scale = timeline.backward_ms > 0 ? backward / timeline.backward_ms : 1;
  w.forward_ms = compute.forward_ms;
  w.backward_ms = backward;
  w.other_ms = other;
  w.compute_shares_cores = true;
  for (auto& g : w.gradients) g.ready_ms *= scale;
  return w;
}

Workload from_stats(const std::string& path, double backward_share) {
  const auto j = read_json(path, "LOCKSTEP_STATS");
  Workload w;
  w.name = path;
  const double compute = j.value("compute_ms", 0.0);
  w.forward_ms = (1 - backward_share) * compute;
  w.backward_ms = backward_share * compute;
  w.data_ms = j.value("data_ms", 0.0);
  double total = 0;
  for (const auto& b : j.value("buckets", nlohmann::json::array())) total += b.value("bytes", 0.0);
  double done = 0;
  for (const auto& b : j.value("buckets", nlohmann::json::array())) {
    done += b.value("bytes", 0.0);
    w.gradients.push_back({b.value("bytes", 0.0), total > 0 ? w.backward_ms * done / total : 0});
  }
  return w;
}

Workload refine_gradients(const Workload& measured, const Description& d) {
  Workload w = measured;
  w.gradients.clear();
  double done = 0;
  for (std::size_t i = d.layer_parameters.size(); i-- > 0;) {
    const double bytes = d.layer_parameters[i] * d.bytes_per_parameter;
    done += bytes;
    w.gradients.push_back({bytes, ready_at(measured.gradients, done)});
  }
  return w;
}

std::vector<PlannedBucket> plan(const std::vector<Gradient>& gradients, double bucket_cap_bytes,
                                double first_bucket_bytes) {
  std::vector<PlannedBucket> out;
  PlannedBucket open;
  bool open_has = false;
  for (const auto& g : gradients) {
    open.bytes += g.bytes;
    open.ready_ms = std::max(open.ready_ms, g.ready_ms);
    open_has = true;
    // As plan_buckets: the cap bounds the first bucket too.
    if (open.bytes >= (out.empty() ? std::min(first_bucket_bytes, bucket_cap_bytes) : bucket_cap_bytes)) {
      out.push_back(open);
      open = {};
      open_has = false;
    }
  }
  if (open_has) out.push_back(open);
  return out;
}

Workload rescale_batch(const Workload& w, int batch) {
  if (w.batch <= 0 || batch <= 0)
    throw InvalidArgument(fmt::format("simulate: cannot rescale a profile of batch {} to batch {}: both must be known "
                                      "and positive",
                                      w.batch, batch));
  Workload out = w;
  const double f = static_cast<double>(batch) / w.batch;
  out.batch = batch;
  out.forward_ms *= f;
  out.backward_ms *= f;
  for (auto& g : out.gradients) g.ready_ms *= f;
  return out;
}

}  // namespace lockstep::sim
