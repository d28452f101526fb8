// FlightRecorder; see flight_recorder.h.
#include "diag/flight_recorder.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace lockstep::diag {

std::string_view to_string(OpState state) {
  switch (state) {
    case OpState::issued: return "issued";
    case OpState::started: return "started";
    case OpState::completed: return "completed";
    case OpState::failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(std::size_t capacity) : ring_(std::max<std::size_t>(capacity, 1)) {}

OpRecord* FlightRecorder::find(std::uint64_t seq) {
  OpRecord& r = ring_[seq % ring_.size()];
  return r.seq == seq && recorded_ > seq ? &r : nullptr;
}

void FlightRecorder::issued(std::uint64_t seq, const OpInfo& info, std::int64_t at_us, bool started) {
  std::lock_guard lock(mutex_);
  OpRecord& r = ring_[seq % ring_.size()];
  r.seq = seq;
  r.info = info;
  r.state = started ? OpState::started : OpState::issued;
  r.issued_us = at_us;
  r.started_us = started ? at_us : 0;
  r.finished_us = 0;
  r.label.clear();
  recorded_ = std::max(recorded_, seq + 1);
}

void FlightRecorder::started(std::uint64_t seq, std::int64_t at_us) {
  std::lock_guard lock(mutex_);
  if (OpRecord* r = find(seq)) {
    r->state = OpState::started;
    r->started_us = at_us;
  }
}

void FlightRecorder::finished(std::uint64_t seq, bool ok, std::int64_t at_us) {
  std::lock_guard lock(mutex_);
  if (OpRecord* r = find(seq)) {
    r->state = ok ? OpState::completed : OpState::failed;
    r->finished_us = at_us;
    if (r->started_us == 0) r->started_us = at_us;
  }
}

void FlightRecorder::label(std::uint64_t seq, std::string text) {
  std::lock_guard lock(mutex_);
  if (OpRecord* r = find(seq)) r->label = std::move(text);
}

std::string FlightRecorder::label_of(std::uint64_t seq) const {
  std::lock_guard lock(mutex_);
  const OpRecord& r = ring_[seq % ring_.size()];
  return r.seq == seq && recorded_ > seq ? r.label : std::string();
}

std::vector<OpRecord> FlightRecorder::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<OpRecord> out;
  const std::uint64_t n = std::min<std::uint64_t>(recorded_, ring_.size());
  for (std::uint64_t seq = recorded_ - n; seq < recorded_; ++seq) out.push_back(ring_[seq % ring_.size()]);
  return out;
}

std::string FlightRecorder::to_json(const std::string& self) const {
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& r : snapshot()) {
    ops.push_back({{"seq", r.seq},
                   {"op", std::string(lockstep::to_string(r.info.collective))},
                   {"description", describe(r.info, r.seq)},
                   {"dtype", std::string(lockstep::to_string(r.info.dtype))},
                   {"count", r.info.count},
                   {"state", std::string(to_string(r.state))},
                   {"issued_us", r.issued_us},
                   {"started_us", r.started_us},
                   {"finished_us", r.finished_us},
                   {"label", r.label}});
  }
  return nlohmann::json{{"rank", self}, {"operations", ops}}.dump(1);
}

std::string FlightRecorder::summary() const {
  const auto records = snapshot();
  std::string last_done = "none", in_flight;
  for (const auto& r : records) {
    const std::string what = describe(r.info, r.seq) + (r.label.empty() ? "" : " [" + r.label + "]");
    if (r.state == OpState::completed) last_done = what;
    if (r.state == OpState::issued || r.state == OpState::started)
      in_flight += fmt::format("{}{} ({})", in_flight.empty() ? "" : ", ", what, to_string(r.state));
  }
  return fmt::format("last completed: {}; in flight: {}", last_done, in_flight.empty() ? "none" : in_flight);
}

}  // namespace lockstep::diag
