#include "fsdp_timeline.h"

#include <fmt/format.h>

#include <algorithm>

#include "lockstep/trace.h"

namespace lockstep::torch::detail {

void FsdpTimeline::forward_entered(const void* unit) {
  const std::int64_t now = trace_now_us();
  if (forward_.empty()) {
    if (last_step_ended_ != 0) group_.trace("between steps (optimizer, data, ...)", "step", last_step_ended_, now);
    step_started_ = now;
  }
  forward_[unit] = Span{now, now, now, now};
}
void FsdpTimeline::forward_gathered(const void* unit) { forward_[unit].gathered = trace_now_us(); }
void FsdpTimeline::forward_left(const void* unit) {
  Span& span = forward_[unit];
  span.done = span.left = trace_now_us();
  forward_ended_ = std::max(forward_ended_, span.left);
}
void FsdpTimeline::backward_entered(const void* unit) {
  const std::int64_t now = trace_now_us();
  if (backward_.empty()) backward_started_ = now;
  backward_[unit] = Span{now, now, now, now};
}
void FsdpTimeline::backward_gathered(const void* unit) { backward_[unit].gathered = trace_now_us(); }
void FsdpTimeline::backward_done(const void* unit) { backward_[unit].done = trace_now_us(); }
void FsdpTimeline::backward_left(const void* unit) { backward_[unit].left = trace_now_us(); }

void FsdpTimeline::collective(const std::string& name, const Work& work) {
  if (work.started_us() > 0 && work.finished_us() >= work.started_us())
    group_.trace(name, "collectives", work.started_us(), work.finished_us());
}

std::int64_t FsdpTimeline::own_us(const std::map<const void*, Span>& spans, const void* unit) const {
  const Span& span = spans.at(unit);
  std::int64_t inside = 0;
  for (const auto& [other, s] : spans)
    if (other != unit && s.entered >= span.gathered && s.left <= span.done) inside += s.left - s.entered;
  return std::max<std::int64_t>(0, span.done - span.gathered - inside);
}

void FsdpTimeline::write_step(const std::vector<const void*>& forward_order,
                              const std::vector<std::int64_t>& parameters) {
  const std::int64_t now = trace_now_us();
  if (!forward_.empty()) group_.trace("forward", "step", step_started_, forward_ended_);
  if (!backward_.empty()) group_.trace("backward", "step", backward_started_, now);
  for (std::size_t k = 0; k < forward_order.size(); ++k) {
    const void* unit = forward_order[k];
    for (const auto* spans : {&forward_, &backward_}) {
      if (!spans->count(unit)) continue;
      const std::int64_t start = spans->at(unit).gathered;
      group_.trace(fmt::format("unit {} {} ({} parameters)", k, spans == &forward_ ? "forward" : "backward",
                               parameters[k]),
                   "units", start, start + own_us(*spans, unit));
    }
  }
  forward_.clear();
  backward_.clear();
  forward_ended_ = 0;
  last_step_ended_ = now;
}

}  // namespace lockstep::torch::detail
