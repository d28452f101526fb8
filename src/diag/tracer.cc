// Tracer and trace merging; see tracer.h.
#include "diag/tracer.h"

#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/file.h"

namespace lockstep::diag {

Tracer::Tracer(std::string path, int rank) : path_(std::move(path)), rank_(rank) {}

Tracer::~Tracer() {
  try {
    write();
  } catch (const std::exception&) {
    // A trace is a diagnostic: never let it fail the program's exit.
  }
}

std::string Tracer::file() const { return enabled() ? fmt::format("{}.rank{}.json", path_, rank_) : std::string(); }

void Tracer::event(std::string name, std::string track, std::int64_t start_us, std::int64_t end_us) {
  if (!enabled()) return;
  std::lock_guard lock(mutex_);
  events_.push_back({std::move(name), std::move(track), start_us, std::max(start_us, end_us)});
}

std::string Tracer::write() const {
  if (!enabled()) return {};
  nlohmann::json events = nlohmann::json::array();
  std::map<std::string, int> tracks;
  {
    std::lock_guard lock(mutex_);
    for (const auto& e : events_) {
      const auto [it, added] = tracks.emplace(e.track, static_cast<int>(tracks.size()));
      events.push_back({{"name", e.name}, {"cat", e.track}, {"ph", "X"}, {"ts", e.start_us},
                        {"dur", e.end_us - e.start_us}, {"pid", rank_}, {"tid", it->second}});
    }
  }
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", fmt::format("rank {}", rank_)}}}});
  for (const auto& [track, tid] : tracks)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid}, {"args", {{"name", track}}}});
  const std::string out = file();
  write_file_atomically(out, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n");
  return out;
}

std::size_t merge_traces(const std::vector<std::string>& inputs, const std::string& output) {
  nlohmann::json merged = nlohmann::json::array();
  std::size_t files = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path);
    if (!in) continue;
    const auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("traceEvents")) continue;
    for (const auto& e : doc["traceEvents"]) merged.push_back(e);
    ++files;
  }
  if (files == 0) return 0;  // nothing traced (or no rank got far enough): no empty file
  write_file_atomically(output, nlohmann::json{{"traceEvents", merged}, {"displayTimeUnit", "ms"}}.dump() + "\n");
  return files;
}

}  // namespace lockstep::diag
