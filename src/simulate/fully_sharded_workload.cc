// Fully sharded workloads; see fully_sharded_workload.h.
#include "simulate/fully_sharded_workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "lockstep/error.h"

namespace lockstep::sim {
namespace {

struct Layer {
  double parameters = 0;
  double backward_ms = 0;
};

// The gradients as layers in forward order, each with the backward time
// since the gradient before it (in backward order) became ready.
std::vector<Layer> layers_of(const Workload& w, double bytes_per_parameter) {
  std::vector<Layer> backward_order;
  double previous_ready = 0;
  for (const auto& g : w.gradients) {
    const double ready = std::max(previous_ready, g.ready_ms);
    backward_order.push_back({std::ceil(g.bytes / bytes_per_parameter), ready - previous_ready});
    previous_ready = ready;
  }
  // What backward does after the last gradient is ready belongs to the
  // first layer (the gradient of its input, if any, and backward's end).
  backward_order.back().backward_ms += std::max(0.0, w.backward_ms - previous_ready);
  return {backward_order.rbegin(), backward_order.rend()};
}

// A layer with no backward of its own (a bias, whose gradient is ready with
// its weight's) belongs with the layer before it.
std::vector<Layer> merge_timeless(const std::vector<Layer>& layers) {
  std::vector<Layer> out;
  for (const auto& l : layers) {
    if (!out.empty() && l.backward_ms <= 0) {
      out.back().parameters += l.parameters;
    } else {
      out.push_back(l);
    }
  }
  return out;
}

// Consecutive layers into at most `count` units: a layer goes to the unit
// whose share of the parameters holds its middle element.
std::vector<Layer> group_into_units(const std::vector<Layer>& layers, int count) {
  if (count <= 0) return layers;
  const double total = std::accumulate(layers.begin(), layers.end(), 0.0,
                                       [](double sum, const Layer& l) { return sum + l.parameters; });
  std::vector<Layer> units;
  int last_unit = -1;
  double before = 0;
  for (const auto& l : layers) {
    const double middle = before + l.parameters / 2;
    const int unit = total > 0 ? std::min(count - 1, static_cast<int>(middle / total * count)) : 0;
    if (unit != last_unit || units.empty()) {
      units.push_back({0, 0});
      last_unit = unit;
    }
    units.back().parameters += l.parameters;
    units.back().backward_ms += l.backward_ms;
    before += l.parameters;
  }
  return units;
}

nlohmann::json read_sharded_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("simulate: cannot open the LOCKSTEP_TRACE file {}", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("simulate: {} is not a LOCKSTEP_TRACE file ({})", path, e.what()));
  }
}

double median_ms(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// One unit's compute in one step, as the trace has it.
struct UnitTimes {
  double parameters = 0;
  double forward_ms = -1;  // -1: not in the trace
  double backward_ms = -1;
};

}  // namespace

double ShardedWorkload::parameters() const {
  return std::accumulate(units.begin(), units.end(), 0.0,
                         [](double sum, const ShardedUnit& u) { return sum + u.parameters; });
}

double ShardedWorkload::forward_ms() const {
  return std::accumulate(units.begin(), units.end(), 0.0,
                         [](double sum, const ShardedUnit& u) { return sum + u.forward_ms; });
}

double ShardedWorkload::backward_ms() const {
  return std::accumulate(units.begin(), units.end(), 0.0,
                         [](double sum, const ShardedUnit& u) { return sum + u.backward_ms; });
}

ShardedWorkload units_from(const Workload& w, int unit_count, double bytes_per_parameter) {
  if (w.gradients.empty())
    throw InvalidArgument("simulate: the workload has no gradients to make fully sharded units of; describe the model "
                          "(--model or --layers) or give a profile with buckets");
  if (unit_count < 0 || bytes_per_parameter <= 0)
    throw InvalidArgument(fmt::format("simulate: {} units of {}-byte parameters; give 0 (one unit per layer) or more "
                                      "units, and a positive parameter size",
                                      unit_count, bytes_per_parameter));
  const std::vector<Layer> layers = group_into_units(merge_timeless(layers_of(w, bytes_per_parameter)), unit_count);
  double backward = 0, parameters = 0;
  for (const auto& l : layers) {
    backward += l.backward_ms;
    parameters += l.parameters;
  }
  ShardedWorkload out;
  out.name = w.name;
  out.batch = w.batch;
  out.other_ms = w.other_ms;
  out.data_ms = w.data_ms;
  out.compute_shares_cores = w.compute_shares_cores;
  for (const auto& l : layers) {
    // Forward follows backward's shares; where backward is not timed, the
    // parameters'.
    const double share = backward > 0 ? l.backward_ms / backward : parameters > 0 ? l.parameters / parameters : 0;
    out.units.push_back({l.parameters, w.forward_ms * share, l.backward_ms});
  }
  return out;
}

Workload as_data_parallel(const ShardedWorkload& w) {
  Workload out;
  out.name = w.name;
  out.batch = w.batch;
  out.forward_ms = w.forward_ms();
  out.backward_ms = w.backward_ms();
  out.other_ms = w.other_ms;
  out.data_ms = w.data_ms;
  out.compute_shares_cores = w.compute_shares_cores;
  double ready = 0;
  for (auto u = w.units.rbegin(); u != w.units.rend(); ++u) {
    ready += u->backward_ms;
    out.gradients.push_back({u->parameters * 4, ready});
  }
  return out;
}

// Steps: read the rank's step starts, unit events and rests; file each
// event under the step it starts in; keep the steps that time every unit
// (after `skip` of them); take medians.
ShardedWorkload sharded_from_trace(const std::string& path, int rank, int skip) {
  const nlohmann::json doc = read_sharded_trace(path);
  std::vector<double> step_starts;
  struct UnitEvent {
    int unit = 0;
    bool forward = true;
    double parameters = 0, start_ms = 0, ms = 0;
  };
  std::vector<UnitEvent> unit_events;
  std::vector<std::pair<double, double>> between_events;  // start, ms
  if (doc.is_object() && doc.contains("traceEvents"))
    for (const auto& e : doc["traceEvents"]) {
      if (e.value("ph", "") != "X" || e.value("pid", -1) != rank) continue;
      const std::string name = e.value("name", ""), track = e.value("cat", "");
      const double start = e.value("ts", 0.0) / 1000, ms = e.value("dur", 0.0) / 1000;
      if (track == "step" && name == "forward") step_starts.push_back(start);
      if (track == "step" && name.rfind("between steps", 0) == 0) between_events.push_back({start, ms});
      if (track != "units") continue;
      int unit = 0;
      double parameters = 0;
      char phase[16] = {};
      if (std::sscanf(name.c_str(), "unit %d %15s (%lf parameters)", &unit, phase, &parameters) != 3 || unit < 0)
        continue;
      const std::string p = phase;
      if (p == "forward" || p == "backward") unit_events.push_back({unit, p == "forward", parameters, start, ms});
    }
  std::sort(step_starts.begin(), step_starts.end());
  int units = 0;
  for (const auto& e : unit_events) units = std::max(units, e.unit + 1);
  // Per step: every unit's times, and the rest of the step.
  const auto step_of = [&](double t) {
    return static_cast<int>(std::upper_bound(step_starts.begin(), step_starts.end(), t) - step_starts.begin()) - 1;
  };
  std::vector<std::vector<UnitTimes>> steps(step_starts.size(), std::vector<UnitTimes>(units));
  std::vector<double> rest(step_starts.size(), 0);
  for (const auto& e : unit_events) {
    const int s = step_of(e.start_ms);
    if (s < 0) continue;
    UnitTimes& u = steps[s][e.unit];
    u.parameters = e.parameters;
    (e.forward ? u.forward_ms : u.backward_ms) = e.ms;
  }
  for (const auto& [start, ms] : between_events)
    if (const int s = step_of(start); s >= 0) rest[s] = ms;
  std::vector<std::vector<double>> forward(units), backward(units);
  std::vector<double> parameters(units, 0), other;
  int seen = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const bool complete = units > 0 && std::all_of(steps[s].begin(), steps[s].end(), [](const UnitTimes& u) {
                            return u.forward_ms >= 0 && u.backward_ms >= 0;
                          });
    if (!complete || seen++ < skip) continue;
    for (int k = 0; k < units; ++k) {
      forward[k].push_back(steps[s][k].forward_ms);
      backward[k].push_back(steps[s][k].backward_ms);
      parameters[k] = steps[s][k].parameters;
    }
    other.push_back(rest[s]);
  }
  if (other.empty())
    throw Error(fmt::format("simulate: {} holds no fully sharded step of rank {} with every unit's forward and "
                            "backward after {} warm-up steps; trace a run of at least {} steps with LOCKSTEP_TRACE set",
                            path, rank, skip, skip + 2));
  ShardedWorkload w;
  w.name = path;
  w.other_ms = median_ms(other);
  for (int k = 0; k < units; ++k) w.units.push_back({parameters[k], median_ms(forward[k]), median_ms(backward[k])});
  return w;
}

}  // namespace lockstep::sim
