// DistributedDataParallel for libtorch's C++ frontend: what PyTorch's
// torch.nn.parallel.DistributedDataParallel does, for a torch::nn::Module.
//
//   auto pg = lockstep::init_process_group();
//   auto net = std::make_shared<NetImpl>();
//   lockstep::torch::DistributedDataParallel ddp(net, pg);   // checks and syncs the replicas
//   torch::optim::SGD opt(net->parameters(), 0.1);
//   for (auto& batch : loader) {                              // each rank: its shard
//     opt.zero_grad();
//     auto loss = loss_fn(ddp.forward(batch.data), batch.target);
//     loss.backward();                                        // gradients averaged, overlapped
//     opt.step();                                             // identical on every rank
//   }
//
// Construction is collective: every rank passes the same architecture; the
// parameter names, shapes and dtypes are compared across ranks (a
// MismatchError lists the differences) and rank 0's values are broadcast.
// During backward each parameter's gradient hook hands its gradient to a
// lockstep::Reducer, which all-reduces full buckets while backward goes on;
// at the end of backward the averaged gradients are in param.grad().
//
// The module may be on the CPU or on one GPU (net->to(device) before
// wrapping it): on a GPU the buckets are device memory and every copy and
// collective is ordered by libtorch's current stream, so the step does not
// wait on the host (docs/gpu.md).
//
// With LOCKSTEP_TRACE set, forward, backward, each bucket, the wait at the end
// of backward and the time between steps go into the rank's timeline; with
// LOCKSTEP_STATS=<prefix>, each rank writes <prefix>.rank<r>.json (its step
// statistics and bucket layout) when the DDP is destroyed, which `lockstep
// doctor` reads.
//
// Thread-safety: drive a DDP from one thread (the one running forward and
// backward), like the module itself.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "lockstep/powersgd.h"
#include "lockstep/process_group.h"
#include "lockstep/reducer.h"
#include "lockstep/step_stats.h"
#include "lockstep/torch/join.h"
#include "lockstep/torch/module_outputs.h"

namespace lockstep::torch {

// The comm hooks, where a DDP user looks for them (they live in lockstep::,
// beside the Reducer, which runs them): DDPOptions::comm_hook takes one.
using ::lockstep::allreduce_hook;
using ::lockstep::batched_powersgd_hook;
using ::lockstep::BucketAutotune;
using ::lockstep::bf16_compress_hook;
using ::lockstep::CommHook;
using ::lockstep::CompressionStats;
using ::lockstep::fp16_compress_hook;
using ::lockstep::GradBucket;
using ::lockstep::powersgd_hook;
using ::lockstep::PowerSGDHook;
using ::lockstep::PowerSGDOptions;
// PyTorch's spellings (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook).
inline std::shared_ptr<PowerSGDHook> powerSGD_hook(PowerSGDOptions options = {}) {
  return powersgd_hook(std::move(options));
}
inline std::shared_ptr<PowerSGDHook> batched_powerSGD_hook(PowerSGDOptions options = {}) {
  return batched_powersgd_hook(std::move(options));
}

namespace detail {
// A comm hook made of a state and a function, for register_comm_hook(state, hook).
template <typename State, typename Fn>
class FunctionCommHook final : public CommHook {
 public:
  FunctionCommHook(State state, Fn fn) : state_(std::move(state)), fn_(std::move(fn)) {}
  std::string name() const override { return "custom"; }
  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override { return fn_(state_, pg, bucket); }

 private:
  State state_;
  Fn fn_;
};
}  // namespace detail

struct DDPOptions {
  // Gradients are all-reduced in buckets of about this size (MiB).
  double bucket_cap_mb = 25.0;
  // Choose bucket_cap_mb from this job's measurements instead: the first
  // synchronised steps run with bucket_cap_mb while DDP records when each
  // gradient becomes ready; before the fourth training forward the ranks
  // time a few all-reduces (fitting the group's latency and bandwidth), and
  // the buckets are re-planned once with the cap that the step model of
  // `lockstep simulate` predicts to leave the least communication exposed
  // after backward. The choice is collective (the slowest rank's timings,
  // rank 0's decision, broadcast), logged at INFO, and available from
  // bucket_cap_mb() and bucket_autotune(). See docs/performance.md.
  bool autotune_bucket_cap = false;
  // The first bucket (the last layers' gradients, ready first) is smaller,
  // so communication starts early; it never exceeds bucket_cap_mb, so a
  // small cap alone (bucket_cap_mb = 0.01) gives small buckets throughout.
  double first_bucket_mb = 1.0;
  // Parameters may go unused in some iterations (branches): they then
  // contribute zero gradients instead of raising an error.
  bool find_unused_parameters = false;
  // The graph and the used parameters are the same every iteration.
  bool static_graph = false;
  // param.grad() are views into the communication buckets: no copies.
  bool gradient_as_bucket_view = false;
  // Broadcast buffers (e.g. BatchNorm running statistics) from rank 0
  // before each training forward. Evaluation forwards (no grad, or the
  // module in eval mode) are local: they use this rank's buffers and issue
  // no collective, so evaluating on rank 0 alone is safe.
  bool broadcast_buffers = true;
  // Null: average each bucket with allreduce. See fp16_compress_hook().
  std::shared_ptr<CommHook> comm_hook;
  // Every this many training steps the ranks compare where their time went
  // and name stragglers (one small allgather); 0: never.
  std::size_t stats_window = 50;
};

// Timings of the last step (steady-clock microseconds).
struct StepTimes {
  std::int64_t forward_start_us = 0;
  std::int64_t forward_end_us = 0;
  StepStats backward;  // from the Reducer
  double data_ms = 0;  // data loading marked with data_timer() since the last forward
  double forward_ms() const { return (forward_end_us - forward_start_us) / 1000.0; }
};

// The part of DDP that does not depend on the module's forward signature.
// As a Joinable (lockstep/torch/join.h), a rank that ran out of inputs
// shadows the buffer broadcast and the gradient all-reduces (with zeros),
// and at the end every rank takes the model of the last rank to join.
class DataParallelCore : public Joinable {
 public:
  DataParallelCore(std::shared_ptr<::torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                   DDPOptions options);
  ~DataParallelCore();
  DataParallelCore(const DataParallelCore&) = delete;
  DataParallelCore& operator=(const DataParallelCore&) = delete;

  void before_forward();
  void after_forward(const std::vector<::torch::Tensor>& outputs);

  Reducer& reducer();
  const Reducer& reducer() const;
  ProcessGroup& group() const;
  const StepTimes& last_step() const;
  // Names of the parameters in each bucket, bucket by bucket.
  std::vector<std::vector<std::string>> bucket_layout() const;
  // The bucket cap in effect (MiB): the configured one, or the one
  // autotuning chose once it has run.
  double bucket_cap_mb() const;
  // What autotuning measured and chose; empty before it runs (or without
  // DDPOptions::autotune_bucket_cap, or in a world of one).
  const std::optional<BucketAutotune>& bucket_autotune() const;

  // This rank's averages over its steps so far (the first two, warm-up,
  // left out).
  RankSummary summary() const;
  // Every rank's averages over the last stats window, and the ranks found
  // to be stragglers (the same on every rank).
  const std::vector<RankSummary>& last_window() const;
  const std::vector<int>& stragglers() const;

  // Adds time spent loading data to the current step (see DataTimer).
  void add_data_time(std::int64_t start_us, std::int64_t end_us);

  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  ProcessGroup& join_process_group() override { return group(); }

  // See DistributedDataParallel::register_comm_hook.
  void register_comm_hook(std::shared_ptr<CommHook> hook);

 private:
  class Shadow;
  struct State;
  std::unique_ptr<State> state_;
};

// Marks data loading, for the step statistics and the timeline. It runs
// from construction (or restart) to stop() or destruction:
//   { auto timer = ddp.data_timer(); batch = next_batch(); }
// or, around a range-for over a DataLoader, whose fetch hides in the loop:
//   auto loading = ddp.data_timer();
//   for (auto& batch : *loader) { loading.stop(); ...step...; loading.restart(); }
class DataTimer {
 public:
  explicit DataTimer(DataParallelCore& core);
  ~DataTimer();
  DataTimer(const DataTimer&) = delete;
  DataTimer& operator=(const DataTimer&) = delete;
  void stop();     // adds the time since (re)start; idempotent
  void restart();

 private:
  DataParallelCore& core_;
  std::int64_t start_us_;  // 0: stopped
};

// Disables gradient synchronisation while it lives (gradient accumulation):
// backward passes only accumulate locally, and the first synchronised
// backward afterwards averages the accumulated gradients.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer& reducer) : reducer_(reducer), previous_(reducer.sync()) { reducer.set_sync(false); }
  ~NoSyncGuard() { reducer_.set_sync(previous_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  Reducer& reducer_;
  bool previous_;
};


// ModuleImpl is the module class with a forward(...) method, e.g. NetImpl
// for TORCH_MODULE(Net), or torch::nn::LinearImpl.
template <typename ModuleImpl>
class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<ModuleImpl> module, std::shared_ptr<ProcessGroup> pg,
                          DDPOptions options = {})
      : module_(std::move(module)), core_(module_, std::move(pg), std::move(options)) {}
  template <typename Holder, typename = decltype(std::declval<Holder>().ptr())>
  DistributedDataParallel(const Holder& holder, std::shared_ptr<ProcessGroup> pg, DDPOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(pg), std::move(options)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    core_.before_forward();
    auto out = module_->forward(std::forward<Args>(args)...);
    std::vector<::torch::Tensor> tensors;
    detail::collect(tensors, out);
    core_.after_forward(tensors);
    return out;
  }

  // PyTorch's DistributedDataParallel.register_comm_hook: replaces the
  // plain average of each gradient bucket with `hook` (fp16_compress_hook(),
  // powersgd_hook(options), ...; the hook object holds its state), as
  // DDPOptions::comm_hook does at construction. Once, before the first
  // forward: a second call, a call after a hook came with DDPOptions, or a
  // call after the first forward throws InvalidArgument naming the cause.
  // Collective: every rank registers the same kind of hook (a MismatchError
  // names the ranks that differ).
  void register_comm_hook(std::shared_ptr<CommHook> hook) { core_.register_comm_hook(std::move(hook)); }
  // PyTorch's form, register_comm_hook(state, hook), for a hook written as
  // a function: hook(state, pg, bucket) is called for every bucket with this
  // DDP's copy of `state`, and returns the Work after which bucket.buffer
  // holds the group's average (it reduces in place: bucket.input is
  // bucket.buffer). E.g.
  //   ddp.register_comm_hook(0, [](int& calls, ProcessGroup& pg, const GradBucket& b) {
  //     ++calls;
  //     return pg.allreduce(b.buffer, lockstep::ReduceOp::avg);
  //   });
  template <typename State, typename Fn,
            typename = std::enable_if_t<
                std::is_invocable_r_v<std::shared_ptr<Work>, Fn&, State&, ProcessGroup&, const GradBucket&>>>
  void register_comm_hook(State state, Fn hook) {
    register_comm_hook(std::make_shared<detail::FunctionCommHook<State, Fn>>(std::move(state), std::move(hook)));
  }

  // Use as: { auto guard = ddp.no_sync(); loss.backward(); }
  NoSyncGuard no_sync() { return NoSyncGuard(core_.reducer()); }
  DataTimer data_timer() { return DataTimer(core_); }
  RankSummary summary() const { return core_.summary(); }
  const std::vector<RankSummary>& last_window() const { return core_.last_window(); }
  const std::vector<int>& stragglers() const { return core_.stragglers(); }

  // For lockstep::torch::Join: Join join({ddp});
  operator Joinable&() { return core_; }

  ModuleImpl& module() { return *module_; }
  const std::shared_ptr<ModuleImpl>& module_ptr() const { return module_; }
  Reducer& reducer() { return core_.reducer(); }
  const StepTimes& last_step() const { return core_.last_step(); }
  std::vector<std::vector<std::string>> bucket_layout() const { return core_.bucket_layout(); }
  double bucket_cap_mb() const { return core_.bucket_cap_mb(); }
  const std::optional<BucketAutotune>& bucket_autotune() const { return core_.bucket_autotune(); }

 private:
  std::shared_ptr<ModuleImpl> module_;
  DataParallelCore core_;
};

// Class template argument deduction: `DistributedDataParallel ddp(net, pg)`
// for a module holder (torch::nn::Sequential, a TORCH_MODULE type) or a
// shared_ptr to the module class.
template <typename ModuleImpl>
DistributedDataParallel(const ::torch::nn::ModuleHolder<ModuleImpl>&, std::shared_ptr<ProcessGroup>,
                        DDPOptions = {}) -> DistributedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
DistributedDataParallel(std::shared_ptr<ModuleImpl>, std::shared_ptr<ProcessGroup>, DDPOptions = {})
    -> DistributedDataParallel<ModuleImpl>;

// lockstep's element type for a torch dtype; throws InvalidArgument for
// types lockstep does not move (complex, ...).
DType dtype_of(::torch::ScalarType type);

// The memory of a contiguous CPU or CUDA tensor, for a collective. A CUDA
// tensor's buffer names libtorch's current stream of its device on this
// thread, so the collective runs after the work queued there and
// Work::wait() orders that stream after it. Another device is an
// InvalidArgument naming `what`.
Buffer buffer_of(const ::torch::Tensor& t, std::string_view what);

// A tensor of at least this many bytes is broadcast in its own memory by
// default: a packed copy would cost two passes over it (the pack, then the
// copy out) for a saving of one collective's fixed cost, which at this
// size is already a small part of the broadcast.
constexpr std::size_t kInPlaceBroadcastBytes = 1 << 20;

// Broadcasts `tensors` from `root`: each contiguous tensor of
// `in_place_bytes` or more in its own memory, the others packed, one
// collective per dtype.
void broadcast_coalesced(ProcessGroup& pg, const std::vector<::torch::Tensor>& tensors, int root,
                         std::size_t in_place_bytes = kInPlaceBroadcastBytes);

// What broadcast_coalesced does, for the group ranks in `receivers` alone
// (`root` sends each of them every transfer): where the other ranks hold
// the bytes already (a replacement fed by a peer while the rest keep
// theirs), they neither copy nor take cores from those that do, and
// return at once, as the receivers and the root do with nobody to send to.
// Every receiver and the root must call it with the same tensors' shapes.
void send_coalesced(ProcessGroup& pg, const std::vector<::torch::Tensor>& tensors, int root,
                    const std::vector<int>& receivers, std::size_t in_place_bytes = kInPlaceBroadcastBytes);

// Checks that every rank has the same named tensors (names, shapes,
// dtypes); throws MismatchError listing the differences and the ranks.
// Collective (uses the group's store). `what` names them ("parameters").
void verify_same_across_ranks(ProcessGroup& pg, const std::vector<std::pair<std::string, ::torch::Tensor>>& named,
                              const std::string& what);

// The same for named descriptions (e.g. option values): throws
// MismatchError naming `what` ("the DistributedDataParallel options"), each
// difference with its ranks and values, and `remedy`. Collective.
void verify_same_descriptions(ProcessGroup& pg, const std::vector<std::pair<std::string, std::string>>& described,
                              const std::string& what, const std::string& remedy);

}  // namespace lockstep::torch
