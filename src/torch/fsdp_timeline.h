// What a fully sharded step writes to the rank's timeline (LOCKSTEP_TRACE):
// per unit, its own forward and backward compute (from the end of the wait
// for its gather to the end of its work, less the units run inside it),
// as `unit K forward (P parameters)` on the "units" track, K its place in
// forward order; the step's forward, backward and the time between steps
// on the "step" track; each gather and reduce-scatter on "collectives".
// `lockstep simulate --sharded-trace` reads exactly these.
//
// Thread-safety: driven by the thread running forward and backward.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep::torch::detail {

class FsdpTimeline {
 public:
  // Times of one unit's forward or backward: entered (before the wait for
  // its gather), gathered (after it), done (its compute over) and left
  // (its reduce-scatter issued, in backward).
  struct Span {
    std::int64_t entered = 0, gathered = 0, done = 0, left = 0;
  };

  explicit FsdpTimeline(ProcessGroup& group) : group_(group) {}
  bool on() const { return group_.tracing(); }

  void forward_entered(const void* unit);
  void forward_gathered(const void* unit);
  void forward_left(const void* unit);
  void backward_entered(const void* unit);
  void backward_gathered(const void* unit);
  void backward_done(const void* unit);
  void backward_left(const void* unit);
  // A collective's own start and end, once it is done.
  void collective(const std::string& name, const Work& work);
  // At the end of backward: every unit's events, in forward order, with
  // their parameter counts; then the step's.
  void write_step(const std::vector<const void*>& forward_order, const std::vector<std::int64_t>& parameters);

 private:
  // A span's own time: gathered to done, less the spans (entered to left)
  // of the units that ran inside it.
  std::int64_t own_us(const std::map<const void*, Span>& spans, const void* unit) const;

  ProcessGroup& group_;
  std::map<const void*, Span> forward_, backward_;
  std::int64_t step_started_ = 0, forward_ended_ = 0, backward_started_ = 0, last_step_ended_ = 0;
};

}  // namespace lockstep::torch::detail
