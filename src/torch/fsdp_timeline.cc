#include "fsdp_timeline.h"

#include <fmt/format.h>

#include <time.h>

#include <algorithm>

#include "lockstep/trace.h"

namespace lockstep::torch::detail {
namespace {

std::int64_t thread_cpu_us() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000 + t.tv_nsec / 1000;
}

}  // namespace

void FsdpTimeline::mark(Span& span, std::int64_t Times::*field) {
  span.wall.*field = trace_now_us();
  span.cpu.*field = thread_cpu_us();
}

FsdpTimeline::Span FsdpTimeline::entered_now() {
  const std::int64_t wall = trace_now_us(), cpu = thread_cpu_us();
  return Span{{wall, wall, wall, wall}, {cpu, cpu, cpu, cpu}};
}

void FsdpTimeline::forward_entered(const void* unit) {
  const Span span = entered_now();
  if (forward_.empty()) {
    if (last_step_ended_ != 0)
      group_.trace(fmt::format("between steps (optimizer, data, ...; {} us of CPU)", span.cpu.entered - last_step_ended_cpu_),
                   "step", last_step_ended_, span.wall.entered);
    step_started_ = span.wall.entered;
  }
  forward_[unit] = span;
}
void FsdpTimeline::forward_gathered(const void* unit) { mark(forward_[unit], &Times::gathered); }
void FsdpTimeline::forward_left(const void* unit) {
  Span& span = forward_[unit];
  mark(span, &Times::done);
  span.wall.left = span.wall.done;
  span.cpu.left = span.cpu.done;
  forward_ended_ = std::max(forward_ended_, span.wall.left);
}
void FsdpTimeline::backward_entered(const void* unit) {
  const Span span = entered_now();
  if (backward_.empty()) backward_started_ = span.wall.entered;
  backward_[unit] = span;
}
void FsdpTimeline::backward_gathered(const void* unit) { mark(backward_[unit], &Times::gathered); }
void FsdpTimeline::backward_done(const void* unit) { mark(backward_[unit], &Times::done); }
void FsdpTimeline::backward_left(const void* unit) { mark(backward_[unit], &Times::left); }

void FsdpTimeline::collective(const std::string& name, const Work& work) {
  if (work.started_us() > 0 && work.finished_us() >= work.started_us())
    group_.trace(name, "collectives", work.started_us(), work.finished_us());
}

std::int64_t FsdpTimeline::own_us(const std::map<const void*, Span>& spans, const void* unit, Times Span::*clock) {
  const Span& span = spans.at(unit);
  const Times& own = span.*clock;
  std::int64_t inside = 0;
  for (const auto& [other, s] : spans)
    if (other != unit && s.wall.entered >= span.wall.gathered && s.wall.left <= span.wall.done)
      inside += (s.*clock).left - (s.*clock).entered;
  return std::max<std::int64_t>(0, own.done - own.gathered - inside);
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
      const std::int64_t start = spans->at(unit).wall.gathered;
      group_.trace(fmt::format("unit {} {} ({} parameters; {} us of CPU)", k,
                               spans == &forward_ ? "forward" : "backward", parameters[k],
                               own_us(*spans, unit, &Span::cpu)),
                   "units", start, start + own_us(*spans, unit, &Span::wall));
    }
  }
  forward_.clear();
  backward_.clear();
  forward_ended_ = 0;
  last_step_ended_ = now;
  last_step_ended_cpu_ = thread_cpu_us();
}

}  // namespace lockstep::torch::detail
