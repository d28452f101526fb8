// The pipeline hier's large collectives run their pieces through: for each
// piece, a step inside the host on the calling thread, the cross-host step
// on a worker thread (OrderedWorker), then another step inside the host
// on the calling thread. The wire carries piece i while the calling thread
// runs the steps inside the host of pieces i+1 and i-1; every rank of a
// host issues its shm steps in the same order (before of i, then after of
// i-1), so they always meet. One piece runs the three steps in turn on the
// calling thread.
//
// Not thread-safe: called from the progress thread; `across` runs on the
// worker, one piece at a time, and must touch only its piece and the
// cross-host transport.
#pragma once

#include <cstddef>
#include <functional>

#include "comm/backend.h"

namespace lockstep {

struct PipelineSteps {
  std::function<void(std::size_t piece)> before;                        // inside the host; may be empty
  std::function<void(const OpContext& op, std::size_t piece)> across;   // across hosts, on the worker
  std::function<void(std::size_t piece)> after;                         // inside the host; may be empty
};

void run_pipeline(const OpContext& op, std::size_t pieces, const PipelineSteps& steps);

}  // namespace lockstep
