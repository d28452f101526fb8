// What hook_with_zero_step shares with its ZeroRedundancyOptimizer: the
// step of one bucket's parameters, and which parameters were stepped since
// the last zero.step(). Thread-safety: step() may run on any thread (one
// at a time, under the mutex); finish_step() runs on the training thread
// after DDP's backward waited for every bucket's step.
#pragma once

#include <torch/torch.h>

#include <mutex>
#include <unordered_set>
#include <vector>

#include "lockstep/torch/zero.h"

namespace lockstep::torch::detail {

// A parameter of a reduced bucket: the parameter, its averaged gradient (a
// view of the bucket), and whether this rank's shard holds it.
struct BucketParam {
  ::torch::Tensor param;
  ::torch::Tensor averaged;
  bool owned = false;
};

class ZeroOverlap {
 public:
  // Steps the owned parameters among `params` with `zero`'s shard optimizer,
  // restricted to them, from their averaged gradients, with the options of
  // zero's parameter groups.
  void step(ZeroRedundancyOptimizer& zero, const std::vector<BucketParam>& params);
  // zero.step() in overlap mode: throws InvalidArgument unless a hook is
  // attached and every parameter was stepped since the last call; then
  // starts the next iteration's count.
  static void finish_step(ZeroRedundancyOptimizer& zero);
  // Ties `zero` to a new hook's state; InvalidArgument if it has one.
  static std::shared_ptr<ZeroOverlap> attach(ZeroRedundancyOptimizer& zero);

 private:
  std::mutex mutex_;
  std::unordered_set<const void*> stepped_;  // TensorImpl of each parameter in a completed bucket
};

}  // namespace lockstep::torch::detail
