// One sharding unit of fully_shard (lockstep/torch/fully_shard.h): its
// parameters' flat shard, the all-gather that makes them whole, the hooks
// that find its backward's start and end, and the reduce-scatter of its
// gradients. A model's units share an FsdpStep, which orders them.
//
// A parameter tensor is one TensorImpl for the whole run (the module and
// the optimizer hold it); what it points at changes with set_data, which
// keeps its autograd identity and version counter:
//   sharded:   a 1-D view of this rank's piece of it, in shard_;
//   unsharded: a view of its place in full_, in its own shape.
// full_ keeps one storage for the whole run, whose memory is freed when the
// unit reshards and allocated again before the next gather: the views
// autograd saved during forward (weight.t(), ...) point into that storage,
// so they see the parameters gathered for backward.
//
// Thread-safety: driven by the thread running forward and backward (hooks
// and the end-of-backward callback run on it for CPU tensors).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/shard_layout.h"
#include "fsdp_timeline.h"
#include "libtorch_version.h"
#include "lockstep/process_group.h"
#include "lockstep/torch/fully_shard.h"

namespace lockstep::torch::detail {

class FsdpUnit;

// What the units of one model share during a step.
struct FsdpStep {
  std::vector<FsdpUnit*> units;          // in the order they were made: blocks first, the root last
  FsdpUnit* root = nullptr;
  // As the first training forward ran them, which prefetching follows:
  // forward in the order they started, backward in the reverse of the
  // order they finished.
  std::vector<FsdpUnit*> forward_order;
  std::vector<FsdpUnit*> backward_order;
  bool order_known = false;
  bool in_step = false;                  // a training forward ran; backward has not finished
  bool backward_queued = false;          // the end-of-backward callback is queued
  std::vector<FsdpUnit*> reducing;       // reduce-scatters in flight, oldest first
  std::unique_ptr<FsdpTimeline> timeline;
  // Set between begin_held_step and finish_held_step: a step over several
  // logical shards on the group re-formed after a rank's death.
  struct HeldShards {
    std::shared_ptr<ProcessGroup> group;  // the re-formed group
    std::vector<int> holder;              // holder[s]: the rank of `group` holding shard s
    std::vector<int> shards;              // this rank's, ascending
    int own_shard = -1;                   // the one this rank always held
  };
  std::optional<HeldShards> held;
};

class FsdpUnit {
 public:
  // `params`: the unit's own parameters by name (those of units inside it
  // excluded), `nested`: those units. Shards the parameters (collective).
  FsdpUnit(std::string name, std::vector<std::pair<std::string, ::torch::Tensor>> params,
           std::vector<std::pair<std::string, std::shared_ptr<FsdpUnit>>> nested, std::shared_ptr<ProcessGroup> group,
           FullyShardOptions options);
  ~FsdpUnit();
  FsdpUnit(const FsdpUnit&) = delete;
  FsdpUnit& operator=(const FsdpUnit&) = delete;

  void before_forward();
  void after_forward(const std::vector<::torch::Tensor>& outputs);
  ::torch::Tensor cast_forward_input(const ::torch::Tensor& t) const;

  // Outside a step (FSDPModule.unshard / reshard).
  void unshard();
  void reshard_outside_step();

  const std::string& name() const { return name_; }
  ProcessGroup& group() const { return *group_; }
  const std::shared_ptr<ProcessGroup>& group_ptr() const { return group_; }
  const FullyShardOptions& options() const { return options_; }
  FullyShardOptions& options() { return options_; }
  const ShardLayout& layout() const { return layout_; }
  const std::vector<std::string>& param_names() const { return names_; }
  const std::vector<::torch::Tensor>& params() const { return params_; }
  const std::vector<std::vector<std::int64_t>>& shapes() const { return shapes_; }
  ::torch::ScalarType dtype() const { return dtype_; }
  const ::torch::Tensor& shard() const { return shard_; }
  FsdpStep& step() { return *step_; }
  // This unit and every unit inside it.
  std::vector<FsdpUnit*> units_within();
  void set_gradient_sync(bool sync) { gradient_sync_ = sync; }
  // Keep the reduced shard that the parameters' gradients are views of
  // (gradient_memory()), for a reader that sends them as one buffer
  // (ShardBackup). The gradients keep it alive anyway; kept, it outlives
  // gradients the user replaces, until the next step's.
  void keep_gradient_memory() { keep_gradient_memory_ = true; }
  const ::torch::Tensor& gradient_memory() const { return gradient_memory_; }
  // Whether the last reduction gave parameter `i` a gradient: it is
  // trained and some rank's backward reached it.
  bool reduced_gradient(std::size_t i) const {
    return params_[i].requires_grad() && i < used_anywhere_.size() && used_anywhere_[i];
  }

  // A step of a job that lost a rank and goes on in place (docs/fsdp.md,
  // "Backup shards"), called on the root unit. The units keep their
  // layout of logical shards (one per rank of the group they were made
  // on); this rank's shards are `own_shard` (the one it always held) and
  // those it took over, whose blocks (a ShardBackup copy's) come in
  // `other_blocks`: one list per unit in step().units order, one block per
  // taken-over shard in ascending shard order, shard_elements() each, of
  // the parameters' dtype. `group` is the group of survivors and
  // holder[s] the rank of it that holds shard s.
  //   begin_held_step: gathers every unit whole from the held blocks
  //     (allgather_shards on `group`) and keeps it whole until the end.
  //   Then one forward and backward per held shard, on that shard's part
  //     of the batch, in ascending shard order: each backward's gradients
  //     are kept apart, per unit, and nothing is reduced.
  //   finish_held_step: every unit's gradients reduce-scattered over the
  //     shards (reduce_scatter_shards, avg), the same bits as the full
  //     group's step; the units return to their shards with their own
  //     shard's gradients, as after an ordinary backward. Returns the
  //     taken-over shards' reduced gradients, laid out as other_blocks.
  // Collective over `group`. The parameters' gradients are set aside at
  // begin_held_step as forward sets them aside, and this step's added to
  // them at the end: zero them (zero_grad) before it. Refused
  // mid-accumulation (gradient sync off with gradients kept: the lost
  // rank's part of them is gone).
  void begin_held_step(std::shared_ptr<ProcessGroup> group, std::vector<int> holder, int own_shard,
                       const std::vector<std::vector<::torch::Tensor>>& other_blocks);
  std::vector<std::vector<::torch::Tensor>> finish_held_step();
  // After a step's collective failed (a rank died mid-step), on the root
  // unit: every unit back to its shard with the gradients it had before
  // the step, nothing in flight (each operation the step issued is waited
  // for, so that none writes into memory later; on a failed group they end
  // at once, their errors dropped), ready for begin_held_step. Gradients
  // kept without sync (set_requires_gradient_sync(false)) stay.
  void abandon_step();

 private:
  enum class State { sharded, gathering, unsharded };
  struct PendingReduce {
    std::shared_ptr<Work> work;
    ::torch::Tensor input;   // the unsharded gradients, flat
    ::torch::Tensor output;  // this rank's shard of their average
  };
  bool is_root() const { return step_->root == this; }
  void refuse_shared_parameters(const std::vector<std::pair<std::string, ::torch::Tensor>>& params) const;
  void allocate_full();
  void start_gather();
  void finish_gather();
  void gather_now();
  void use_unsharded();
  void use_sharded();
  void hook_accumulators();
  void stash_gradients();
  void pre_backward();
  void on_gradient();
  void post_backward();
  void issue_reduce_scatter();
  std::shared_ptr<Work> reduce_scatter_in_shard_order(const ::torch::Tensor& flat, const ::torch::Tensor& output);
  void finish_reduce();
  void finish_step();
  void end_backward();
  void agree_on_used_parameters();
  ProcessGroup& step_group() const { return step_->held ? *step_->held->group : *group_; }
  void check_held_blocks(int taken_over, const std::vector<::torch::Tensor>& blocks) const;
  void gather_held(const std::vector<::torch::Tensor>& blocks);
  std::vector<::torch::Tensor> reduce_held();
  void end_held_backward();
  void abandon();
  void return_to_shards();
  void start_prefetch(const std::vector<FsdpUnit*>& order);
  ::torch::Tensor flat_gradients();
  void wait_named(Work& work, const char* what);

  std::string name_;
  std::shared_ptr<ProcessGroup> group_;
  FullyShardOptions options_;
  std::vector<std::string> names_;
  std::vector<::torch::Tensor> params_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::vector<std::size_t> trained_;  // indices of the parameters that require grad
  ShardLayout layout_;
  std::vector<ShardPiece> pieces_;    // this rank's piece of each parameter (count 0: none)
  ::torch::ScalarType dtype_;         // the parameters'
  ::torch::ScalarType compute_dtype_; // gathered and used in forward and backward
  ::torch::ScalarType reduce_dtype_;  // gradients reduce-scattered in
  ::torch::Tensor shard_;             // this rank's shard, dtype_
  ::torch::Tensor full_;              // every rank's, compute_dtype_; memory only while unsharded
  std::size_t full_bytes_ = 0;
  bool alone_ = false;                // a world of one: full_ is shard_
  State state_ = State::sharded;
  std::shared_ptr<Work> gather_work_;
  ::torch::Tensor gather_input_;      // the shard cast to compute_dtype_, while a gather needs it
  std::vector<libtorch::GradAccumulator> accumulators_;  // by trained_ index
  std::vector<std::uintptr_t> hook_keys_;
  std::vector<::torch::Tensor> stash_;  // gradients of the shards from before this step
  bool stashed_ = false;
  bool backward_prepared_ = false;
  bool reduced_ = false;
  std::size_t gradients_ready_ = 0;
  // Whether each parameter got a gradient on this rank since the last
  // reduce-scatter, and then on any rank: a parameter no rank used keeps
  // its gradient as it was, as in one process.
  std::vector<bool> had_gradient_;
  std::vector<bool> used_anywhere_;
  PendingReduce pending_;
  ::torch::Tensor reduced_shard_;       // the finished reduce-scatter's result, dtype_
  ::torch::Tensor accumulated_;         // unsharded gradients kept while gradient sync is off
  std::vector<::torch::Tensor> held_flats_;  // a held step's flat gradients, one per held shard's backward
  bool gradient_sync_ = true;
  bool keep_gradient_memory_ = false;
  ::torch::Tensor gradient_memory_;
  std::shared_ptr<FsdpStep> step_;
  std::vector<std::shared_ptr<FsdpUnit>> nested_;  // kept alive with the root
};

}  // namespace lockstep::torch::detail
