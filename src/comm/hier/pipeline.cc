// The pieces' schedule; see pipeline.h.
#include "comm/hier/pipeline.h"

#include "comm/hier/ordered_worker.h"

namespace lockstep {

void run_pipeline(const OpContext& op, std::size_t pieces, const PipelineSteps& steps) {
  const auto before = [&](std::size_t i) {
    if (steps.before) steps.before(i);
  };
  const auto after = [&](std::size_t i) {
    if (steps.after) steps.after(i);
  };
  if (pieces == 1) {
    before(0);
    steps.across(op, 0);
    after(0);
    return;
  }
  OpContext across_op = op;  // declared before the worker, which uses it until joined
  OrderedWorker worker;
  across_op.cancel = worker.cancel_flag();
  try {
    for (std::size_t i = 0; i < pieces; ++i) {
      before(i);
      worker.submit([&steps, &across_op, i] { steps.across(across_op, i); });
      if (i == 0) continue;
      worker.wait(i - 1, op.cancel);
      after(i - 1);
    }
    worker.wait(pieces - 1, op.cancel);
    after(pieces - 1);
  } catch (...) {
    worker.cancel();  // the destructor joins; the worker's transfer ends at its next look at the flag
    throw;
  }
}

}  // namespace lockstep
