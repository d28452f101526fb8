// ZeroRedundancyOptimizer: ZeRO stage 1, as PyTorch's
// torch.distributed.optim.ZeroRedundancyOptimizer. The parameters are split
// into one shard per rank; each rank keeps the optimizer state of its shard
// only (about 1/N of it), updates only that shard, and the updated shards
// are all-gathered so every rank ends the step with all parameters.
//
//   lockstep::torch::DistributedDataParallel ddp(net, pg);   // averages the gradients
//   lockstep::torch::ZeroRedundancyOptimizer opt(net->parameters(), pg,
//                                                torch::optim::AdamOptions(1e-3));
//   ...  opt.zero_grad(); loss.backward(); opt.step();      // as with torch::optim::Adam
//   opt.consolidate_state_dict(0);                           // collective
//   if (pg->rank() == 0) opt.save(archive);                  // what torch::optim::Adam would save
//
// Results equal the unsharded optimizer's for optimizers that update each
// parameter from its own gradient and state (SGD, Adam, AdamW, Adagrad,
// RMSprop). Shards are assigned greedily, group by group, largest
// parameter first, to the rank with the fewest elements so far (the same on
// every rank), or as equal ranges of elements (ZeroPartition). step() is
// collective: every rank calls it, with the same parameters.
//
// Thread-safety: drive it from one thread, like a torch optimizer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/join.h"

namespace lockstep::torch {

namespace detail {
inline std::unique_ptr<::torch::optim::Optimizer> optimizer_for(std::vector<::torch::Tensor> p,
                                                               const ::torch::optim::SGDOptions& o) {
  return std::make_unique<::torch::optim::SGD>(std::move(p), o);
}
inline std::unique_ptr<::torch::optim::Optimizer> optimizer_for(std::vector<::torch::Tensor> p,
                                                               const ::torch::optim::AdamOptions& o) {
  return std::make_unique<::torch::optim::Adam>(std::move(p), o);
}
inline std::unique_ptr<::torch::optim::Optimizer> optimizer_for(std::vector<::torch::Tensor> p,
                                                               const ::torch::optim::AdamWOptions& o) {
  return std::make_unique<::torch::optim::AdamW>(std::move(p), o);
}
inline std::unique_ptr<::torch::optim::Optimizer> optimizer_for(std::vector<::torch::Tensor> p,
                                                               const ::torch::optim::AdagradOptions& o) {
  return std::make_unique<::torch::optim::Adagrad>(std::move(p), o);
}
inline std::unique_ptr<::torch::optim::Optimizer> optimizer_for(std::vector<::torch::Tensor> p,
                                                               const ::torch::optim::RMSpropOptions& o) {
  return std::make_unique<::torch::optim::RMSprop>(std::move(p), o);
}
// A contiguous range of a parameter's elements (flattened) that one rank
// updates: the whole parameter, or a cut of it (ZeroPartition::balanced_elements).
struct ZeroPiece {
  std::size_t param = 0;  // the parameter's index
  std::int64_t begin = 0;
  std::int64_t count = 0;
  int owner = 0;
};
// What hook_with_zero_step (lockstep/torch/zero_overlap.h) shares with the
// optimizer whose shard it steps.
class ZeroOverlap;
}  // namespace detail

// How the parameters are shared out among the ranks.
enum class ZeroPartition {
  // PyTorch's rule: whole tensors, largest first, each to the rank with the
  // fewest elements so far. One dominant tensor makes one rank hold its
  // whole state (a Linear(1024, 1024) beside small layers: 85%).
  by_tensor,
  // Every dtype's parameters laid end to end and cut into equal ranges, one
  // per rank (DeepSpeed ZeRO-1's layout): each rank holds 1/N of the
  // elements and of the state, whatever the sizes. A tensor crossing a
  // boundary is stepped in pieces (views of its elements, each with its own
  // state), so only optimizers that update each element on its own may do
  // this: exactly SGD, Adam, AdamW, Adagrad or RMSprop (InvalidArgument
  // otherwise); and no add_param_group() after construction (every range
  // would move). Consolidated and loaded state is the unsharded optimizer's.
  balanced_elements,
};

// What PyTorch's ZeroRedundancyOptimizer takes besides the optimizer's own
// options (its keyword arguments), with the same defaults.
struct ZeroOptions {
  // Keep the parameters in one contiguous buffer per dtype, each rank's
  // shard a block of it (the parameters become views of it: the same
  // tensors, so the model and DDP see them), so the all-gather writes the
  // other ranks' shards straight into the parameters: no packing and no
  // copying out. With by_tensor, add_param_group() rebuilds the buffers.
  bool parameters_as_bucket_view = false;
  // Step each shard as DDP's all-reduce of its bucket completes, from a comm
  // hook, instead of in step(): register hook_with_zero_step(hook, ddp, zero)
  // (lockstep/torch/zero_overlap.h); step() then only all-gathers. Not
  // under Join.
  bool overlap_with_ddp = false;
  // Not in PyTorch (its partition is by_tensor): see ZeroPartition.
  ZeroPartition partition = ZeroPartition::by_tensor;
};

// A torch::optim::Optimizer: learning-rate schedulers drive it
// (torch::optim::StepLR sched(zero, 10, 0.5)), torch::save(zero, ...) and
// torch::load(zero, ...) go through save() and load(), parameter groups
// carry their own options (each group's options reach the shard's
// optimizer at every step), add_param_group() adds more, and step(closure)
// evaluates the closure first. param_groups() hold every parameter, as the
// unsharded optimizer's do; state() is empty: the shard's state is in
// local_optimizer().
//
// As a Joinable (lockstep/torch/join.h), for uneven inputs:
// Join join({ddp, zero}). A rank that ran out of data keeps stepping its
// shard on the averaged gradients DDP's join hook leaves it, and takes part
// in the all-gather, so the others' steps complete and every parameter is
// updated as in training without Join (DDP with an unsharded optimizer).
class ZeroRedundancyOptimizer : public ::torch::optim::Optimizer, public Joinable {
 public:
  // Builds the optimizer of a set of parameters: this rank's shard, or all
  // of them for the consolidated state. Called with the same options each
  // time, so that the shards' optimizers and the consolidated one agree.
  // Parameter groups after the first are added to what it returns, each
  // with its own options.
  using OptimizerFactory =
      std::function<std::unique_ptr<::torch::optim::Optimizer>(std::vector<::torch::Tensor> parameters)>;
  using ParamGroup = ::torch::optim::OptimizerParamGroup;

  // Throws InvalidArgument for an empty parameter list. Not collective.
  ZeroRedundancyOptimizer(std::vector<::torch::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          OptimizerFactory make_optimizer, ZeroOptions zero_options = {});
  // Parameter groups; a group without options takes the factory's defaults.
  ZeroRedundancyOptimizer(std::vector<ParamGroup> param_groups, std::shared_ptr<ProcessGroup> group,
                          OptimizerFactory make_optimizer, ZeroOptions zero_options = {});
  // With a torch optimizer's options: SGDOptions, AdamOptions, AdamWOptions,
  // AdagradOptions or RMSpropOptions pick that optimizer.
  template <typename Options,
            typename = decltype(detail::optimizer_for({}, std::declval<const Options&>()))>
  ZeroRedundancyOptimizer(std::vector<::torch::Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                          const Options& options, ZeroOptions zero_options = {})
      : ZeroRedundancyOptimizer(std::move(parameters), std::move(group), factory_for(options), zero_options) {}
  template <typename Options,
            typename = decltype(detail::optimizer_for({}, std::declval<const Options&>()))>
  ZeroRedundancyOptimizer(std::vector<ParamGroup> param_groups, std::shared_ptr<ProcessGroup> group,
                          const Options& options, ZeroOptions zero_options = {})
      : ZeroRedundancyOptimizer(std::move(param_groups), std::move(group), factory_for(options), zero_options) {}

  // Evaluates `closure` (if any, with gradients enabled) and returns its
  // loss; updates this rank's shard from its gradients, with each group's
  // current options, then all-gathers every shard (one allgather per
  // dtype). Collective.
  ::torch::Tensor step(LossClosure closure = nullptr) override;
  // Clears the gradients of all parameters (not only the shard's).
  void zero_grad(bool set_to_none = false);
  // Appends a group, as torch::optim::Optimizer::add_param_group does (also
  // through an Optimizer&). Its parameters are shared out among the ranks
  // without moving those of the earlier groups. Every rank adds the same
  // groups in the same order before its next step.
  void add_param_group(const ParamGroup& param_group);

  // Gathers every shard's optimizer state on rank `to` (point to point: only
  // `to` receives). Collective. Then, on `to`, consolidated() is an
  // optimizer over all parameters whose state is what the unsharded
  // optimizer would hold, and save() writes it.
  void consolidate_state_dict(int to = 0);
  // Throws InvalidArgument on a rank that received no consolidated state.
  ::torch::optim::Optimizer& consolidated();
  const ::torch::optim::Optimizer& consolidated() const;
  // Writes the consolidated state (what the unsharded optimizer saves);
  // InvalidArgument without one. torch::save(zero, ...) calls it.
  void save(::torch::serialize::OutputArchive& archive) const override;
  // Reads a state saved by save() (or by the unsharded optimizer), takes
  // its groups' options and keeps this rank's shard of the state. Every
  // rank calls it with the same archive contents; not collective.
  // torch::load(zero, ...) calls it.
  void load(::torch::serialize::InputArchive& archive) override;

  // The rank that owns (updates) parameter `index` of parameters(); with
  // ZeroPartition::balanced_elements, the owner of its first element.
  int owner(std::size_t index);
  // This rank's optimizer (null when its shard is empty: more ranks than
  // parameters). Its groups' options are set from param_groups() at every
  // step: change those (or use a scheduler on this optimizer).
  ::torch::optim::Optimizer* local_optimizer() { return local_.get(); }
  // Every parameter, group after group.
  const std::vector<::torch::Tensor>& parameters() const { return parameters_; }
  ProcessGroup& group() const { return *group_; }
  const ZeroOptions& zero_options() const { return zero_options_; }

  // For lockstep::torch::Join: a joined rank's step (shard and all-gather).
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  ProcessGroup& join_process_group() override { return *group_; }
  bool joins_at_step() const override { return true; }

 private:
  class JoinedStep;
  friend class detail::ZeroOverlap;
  template <typename Options>
  static OptimizerFactory factory_for(const Options& options) {
    return [options](std::vector<::torch::Tensor> p) { return detail::optimizer_for(std::move(p), options); };
  }
  using PieceStates = std::vector<std::unique_ptr<::torch::optim::OptimizerParamState>>;  // by piece
  void step_shard_and_gather();
  void give_cut_pieces_their_gradients();
  void drop_cut_pieces_gradients();
  void gather(::torch::ScalarType type);
  void sync_groups();
  void share_out();
  void make_bucket_views();
  bool bucket_padded() const;
  void make_piece_tensors();
  bool is_cut(std::size_t piece) const;
  void collect_states(::torch::optim::Optimizer& from, int rank, PieceStates& states) const;
  void put_whole_states(PieceStates& states, ::torch::optim::Optimizer& full) const;
  void take_piece_states(::torch::optim::Optimizer& full);
  std::unique_ptr<::torch::optim::Optimizer> optimizer_over(int rank) const;
  std::vector<::torch::Tensor> shard_of(int rank) const;
  std::vector<::torch::Tensor> shard_of(int rank, std::size_t group) const;
  std::shared_ptr<ProcessGroup> group_;
  OptimizerFactory make_optimizer_;
  ZeroOptions zero_options_;
  std::vector<::torch::Tensor> parameters_;  // every group's, in order
  std::vector<std::size_t> group_of_;        // by parameter index
  std::vector<int> owners_;                  // by parameter index (of its first element)
  // What each rank steps, in order of dtype then parameter; with its tensor
  // (the parameter itself, or a view of the cut elements).
  std::vector<detail::ZeroPiece> pieces_;
  std::vector<::torch::Tensor> piece_tensors_;
  // parameters_as_bucket_view: the buffer of each dtype's parameters.
  std::map<::torch::ScalarType, ::torch::Tensor> buckets_;
  std::vector<std::int64_t> load_;           // elements owned, by rank
  std::size_t groups_seen_ = 0;              // of param_groups(), shared out so far
  std::unique_ptr<::torch::optim::Optimizer> local_;
  std::unique_ptr<::torch::optim::Optimizer> consolidated_;
  // overlap_with_ddp: what its hook_with_zero_step stepped (null before one is made).
  std::shared_ptr<detail::ZeroOverlap> overlap_;
};

// Bytes held in an optimizer's per-parameter state tensors (momentum
// buffers, Adam's moments, ...), for SGD, Adam, AdamW, Adagrad and RMSprop.
std::size_t optimizer_state_bytes(const ::torch::optim::Optimizer& optimizer);

}  // namespace lockstep::torch
