// Uneven inputs: PyTorch's Join context manager for libtorch. When ranks
// have different numbers of batches, a rank that runs out of data keeps
// taking part in the collectives of the ranks still training (with zero
// gradients) until every rank is done, so nobody waits forever.
//
//   lockstep::torch::DistributedDataParallel ddp(net, pg);
//   {
//     lockstep::torch::Join join({ddp});          // ddp is a Joinable; with a
//                                                 // ZeroRedundancyOptimizer: Join({ddp, zero})
//     for (auto& batch : my_batches) {           // 5 on one rank, 9 on another
//       opt.zero_grad();
//       loss_fn(ddp.forward(batch.data), batch.target).backward();
//       opt.step();
//     }
//     join.join();  // shadow the others until all are done (or at scope end)
//   }
//
// Protocol (one small all-reduce per iteration, on the first joinable's
// group): each training iteration of a rank that still has data begins with
// notify_join_context(), an all-reduce of 1. A rank that has joined
// all-reduces 0 in the same place: the sum is the number of ranks still
// training. While it is not 0, the joined rank runs every joinable's
// main_hook(), which issues that joinable's collectives for one iteration
// (DDP: the buffer broadcast and each bucket's all-reduce with zeros, whose
// averages become the joined rank's gradients; ZeroRedundancyOptimizer: the
// step of this rank's shard on those gradients and the all-gather of the
// shards), DDP's before the optimizer's.
// When the sum is 0 every rank has joined and each runs post_hook(), told
// whether it joined last (DDP: every rank takes the last joiner's model).
//
// With throw_on_early_termination, the first rank to run out throws
// EarlyTerminationError instead, and so does every other rank at its next
// training forward (one more all-reduce per iteration tells them).
//
// Thread-safety: a Join and its joinables are driven by one thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "lockstep/error.h"
#include "lockstep/process_group.h"

namespace lockstep::torch {

// With throw_on_early_termination: some rank ran out of inputs.
class EarlyTerminationError : public Error {
 public:
  using Error::Error;
};

struct JoinOptions {
  // false: Join does nothing (the code runs as without it).
  bool enable = true;
  // Throw EarlyTerminationError on every rank as soon as one runs out of
  // inputs, instead of shadowing the others.
  bool throw_on_early_termination = false;
  // DDP: while some ranks have joined, gradients are the sum over the ranks
  // still training divided by the initial world size (PyTorch's default),
  // or, if false, by the number of ranks still training.
  bool divide_by_initial_world_size = true;
};

// What a joinable does on a rank that has joined.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Once per iteration of the ranks still training: issue the collectives
  // this joinable would issue in a training iteration.
  virtual void main_hook() {}
  // Once every rank has joined. `is_last_joiner`: this rank was among the
  // last to run out of data.
  virtual void post_hook(bool is_last_joiner) {}

 protected:
  // While main_hook() runs: how many ranks train in the iteration it
  // shadows (the count of the iteration's first all-reduce).
  int ranks_training() const { return ranks_training_; }

 private:
  friend class Join;
  int ranks_training_ = 0;
};

// How a Join configures a joinable while it is active.
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  // The first joinable of a Join does the per-iteration all-reduce.
  bool is_first_joinable = false;
};

class Join;

// A class whose collectives a joined rank must shadow, e.g.
// DistributedDataParallel or ZeroRedundancyOptimizer. It calls
// Join::notify_join_context(*this) before its own collectives in each
// training iteration (DDP: at the start of forward; an optimizer: at the
// start of its step).
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // The group its collectives run on (every joinable of a Join uses one).
  virtual ProcessGroup& join_process_group() = 0;
  // Whether its collectives come at the end of a training iteration (an
  // optimizer's step) rather than in forward and backward (DDP). A Join
  // shadows those after the others, whatever order they were listed in:
  // Join({ddp, zero}) and Join({zero, ddp}) are the same.
  virtual bool joins_at_step() const { return false; }
  const JoinConfig& join_config() const { return join_config_; }

 private:
  friend class Join;
  JoinConfig join_config_;
  const Join* active_join_ = nullptr;
};

class Join {
 public:
  // Throws InvalidArgument for no joinables, one listed twice, joinables on
  // different groups, or one already inside another active Join.
  Join(std::vector<std::reference_wrapper<Joinable>> joinables, JoinOptions options = {});
  Join(std::vector<std::reference_wrapper<Joinable>> joinables, bool enable, bool throw_on_early_termination = false);
  // Joins if join() was not called and no exception is propagating (an
  // error there is logged: call join() to have it thrown).
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has no more inputs: shadow the others' iterations until every
  // rank has joined, then run the post hooks. Collective (every rank calls
  // it once, after its last iteration). Idempotent.
  void join();

  // Called by a joinable at the start of each training iteration. Returns
  // the number of ranks still training (this one included) when `joinable`
  // is the first of an enabled Join; nullopt otherwise (no collective).
  // Throws EarlyTerminationError if another rank ran out of inputs and
  // throw_on_early_termination is set.
  static std::optional<int> notify_join_context(Joinable& joinable);

 private:
  int all_reduce_count(int mine) const;
  int count_while_joined() const;
  void release();

  std::vector<std::reference_wrapper<Joinable>> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  ProcessGroup* group_ = nullptr;
  bool joined_ = false;
  int uncaught_at_start_ = 0;
};

}  // namespace lockstep::torch
