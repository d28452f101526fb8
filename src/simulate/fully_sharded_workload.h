// What one fully sharded step (fully_shard, FSDP2's model; ZeRO-3) works
// on, as the simulation needs it: the model's units in forward order, each
// with its parameters and the compute of its forward and backward, and the
// rest of the step. Built from a data-parallel workload (a description, or
// a profile refined by one) by grouping its gradients into units, or from
// a LOCKSTEP_TRACE of a fully sharded run. Values and pure functions (the
// reader reads a file); thread-safe.
#pragma once

#include <string>
#include <vector>

#include "simulate/workload.h"

namespace lockstep::sim {

// One unit: the parameters one fully_shard call owns, gathered and reduced
// together. Compute is the unit's own, without waiting for collectives.
struct ShardedUnit {
  double parameters = 0;  // elements
  double forward_ms = 0;
  double backward_ms = 0;
};

struct ShardedWorkload {
  std::string name;
  int batch = 0;  // samples per rank per step; 0: not known
  // Forward order. units[0] is the root, the last unit fully_shard is
  // called on (the model itself), which owns the parameters no other unit
  // took; it runs first in forward and last in backward, and is not
  // resharded after forward. A root without parameters of its own
  // communicates nothing.
  std::vector<ShardedUnit> units;
  double other_ms = 0;  // optimizer and the rest of the step
  double data_ms = 0;
  // As Workload's: false for a fully sharded trace, which times each unit's
  // own compute.
  bool compute_shares_cores = false;
  double parameters() const;
  double forward_ms() const;
  double backward_ms() const;
};

// Units from a data-parallel workload. Its gradients (backward order, each
// ready at a time into backward) are taken as layers in forward order: a
// layer's backward is the time from the previous gradient's readiness to
// its own (backward's remainder after the last one goes to the first
// layer), its forward the same share of forward (by parameters where
// backward is not timed). A layer with no backward of its own (a bias)
// joins the layer before it. `unit_count` > 0 then groups consecutive
// layers into at most that many units of about equal parameters (a unit
// takes the layers whose middle element falls in its share); 0 keeps one
// unit per layer. The first unit is the root. `bytes_per_parameter`: the
// gradients' element size.
ShardedWorkload units_from(const Workload& w, int unit_count = 0, double bytes_per_parameter = 4);

// The same model trained with DDP: one fp32 gradient per unit, ready when
// the unit's backward ends (backward runs the units last to first).
Workload as_data_parallel(const ShardedWorkload& w);

// From a LOCKSTEP_TRACE file of a fully sharded run (`rank` picks the
// process of a merged file), medians over the steps after `skip`. Each
// step opens with a "forward" event on the "step" track; each unit's
// compute is a pair of events on the "units" track,
//   "unit K forward (P parameters)" and "unit K backward (P parameters)",
// K the unit's index in forward order (0: the root) and P its unsharded
// parameter count, timed from the end of the wait for its all-gather to
// the end of its compute; "between steps (optimizer, data, ...)" on the
// "step" track gives the rest of the step. Throws Error when the file
// holds no step with every unit's forward and backward.
ShardedWorkload sharded_from_trace(const std::string& path, int rank = 0, int skip = 2);

}  // namespace lockstep::sim
