// Gradient bucketing for data-parallel training, independent of any
// framework. The Reducer owns contiguous buckets of gradients; a framework
// adapter (lockstep/torch/ddp.h for libtorch) tells it when each parameter's
// gradient is final, and it all-reduces each bucket as soon as the bucket is
// full, in bucket order, while the backward pass goes on.
//
// One training step, as the adapter drives it:
//   maybe_rebuild_buckets()      start of forward (collective, once)
//   check_previous_iteration()   start of forward: report parameters that
//                                got no gradient last time
//   prepare_for_backward(unused) end of forward
//   mark_ready(i)                from each parameter's gradient hook
//   finalize()                   end of backward: wait, write back
//
// Thread-safety: one thread drives a Reducer (the thread running forward and
// backward); collectives complete on the group's progress thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/types.h"

namespace lockstep {

// One parameter as the reducer sees it: a name for messages, and the shape
// of its gradient as a flat run of elements.
struct ParamSpec {
  std::string name;
  std::size_t count = 0;
  DType dtype = DType::f32;
  // The parameter's shape, for hooks that treat gradients as matrices
  // (PowerSGD); empty: a vector of `count` elements.
  std::vector<std::int64_t> shape;
};

struct BucketPlanOptions {
  std::size_t first_bucket_bytes = 1u << 20;  // a small first bucket starts communication early
  std::size_t bucket_cap_bytes = 25u << 20;
};

// A bucket: parameters whose gradients are reduced together, laid out one
// after another in `params` order.
struct Bucket {
  std::vector<std::size_t> params;   // indices into the parameter list
  std::vector<std::size_t> offsets;  // element offset of each parameter in the bucket
  DType dtype = DType::f32;
  std::size_t count = 0;             // elements
  std::size_t bytes() const { return count * dtype_size(dtype); }
};

// Assigns parameters to buckets, visiting them in `order` (by default the
// reverse of model order, since the last layers' gradients are ready first).
// Each bucket holds one dtype; the first bucket of each dtype closes once it
// reaches first_bucket_bytes (or bucket_cap_bytes, if smaller), later ones at
// bucket_cap_bytes; a parameter
// larger than the limit gets a bucket of its own. Buckets are returned in
// the order their first parameter appears in `order`. Pure function.
std::vector<Bucket> plan_buckets(const std::vector<ParamSpec>& params, const std::vector<std::size_t>& order,
                                 const BucketPlanOptions& options);
// The default visiting order: n-1, ..., 1, 0.
std::vector<std::size_t> reverse_order(std::size_t n);

// Gradient memory, provided by the framework adapter. Pointers are to
// contiguous gradients of ParamSpec's count and dtype.
class GradientSource {
 public:
  virtual ~GradientSource() = default;
  // Parameter i's gradient, created (zeroed) if it has none.
  virtual void* gradient(std::size_t i) = 0;
  // Whether parameter i has a gradient now. Frameworks drop them between
  // steps (PyTorch's zero_grad(set_to_none=true), libtorch 2.x's default):
  // the reducer must then not give one back with stale values.
  virtual bool has_gradient(std::size_t i) const = 0;
  // Points parameter i's gradient at `slot` (its values become the slot's),
  // keeping `owner` alive as long as the gradient uses that memory. The
  // framework's gradient object should stay the same where it can.
  virtual void use_as_gradient(std::size_t i, void* slot, std::shared_ptr<void> owner) = 0;
  // If parameter i's gradient lives at `slot`, gives it memory of its own
  // with the same values: the reducer is about to reuse the slot.
  virtual void move_out_of(std::size_t i, const void* slot) = 0;
  // Where every gradient is: host memory, or one CUDA device. On a device
  // the reducer keeps its buckets there, and queues its copies and its
  // collectives on current_stream(), the stream the framework computes
  // gradients on at the moment of the call (a cudaStream_t; null: the
  // default stream), so that no step waits on the host (docs/gpu.md).
  virtual Device device() const { return Device::host(); }
  virtual void* current_stream() const { return nullptr; }
};

// What a communication hook reduces: bucket `index`. `buffer` must hold
// the group's average when the returned Work is done (CUDA memory: for the
// work queued on buffer.stream after Work::wait() and finish()). `input` holds this
// rank's gradients: for a hook whose out_of_place() is true it is other
// memory, which the hook must leave unchanged; otherwise it is `buffer`.
//
// `layout` and `params` say which gradient lies where: parameter
// layout->params[k] (an index into *params) starts at element
// layout->offsets[k]. Elements after the last gradient belong to the
// reducer (the last bucket's flags) and must be averaged exactly. Both
// point into the reducer and are valid during run().
struct GradBucket {
  std::size_t index = 0;
  Buffer buffer;
  bool last = false;
  ConstBuffer input;
  const Bucket* layout = nullptr;
  const std::vector<ParamSpec>* params = nullptr;
};

// Replaces the plain average of each bucket, e.g. to compress it. Runs on
// the thread running backward; the Work may finish on the progress thread.
class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) = 0;
  // Whether run() reads the gradients from bucket.input and writes only
  // bucket.buffer. If not, the reducer copies the gradients into the
  // buffer first.
  virtual bool out_of_place() const { return false; }
  // Whether it can reduce buckets in `device`'s memory; the Reducer
  // refuses at construction a hook that cannot.
  virtual bool supports(Device device) const { return true; }
  // Called after the Work that run() returned was waited for, on the
  // waiting thread, with the same bucket except for its streams: those of
  // the waiter, which the wait ordered after the collective. A hook on
  // CUDA memory queues its last device work there (a compression hook
  // widens its result); hooks on host memory finish inside their Work.
  virtual void finish(const GradBucket& bucket) {}
};

// allreduce(avg) of the bucket as is.
std::shared_ptr<CommHook> allreduce_hook();
// Divide by the world size, send as fp16 (or bf16), sum (accumulated in
// fp32), and widen back: half the bytes of fp32 buckets. Other dtypes are
// reduced as is.
std::shared_ptr<CommHook> fp16_compress_hook();
std::shared_ptr<CommHook> bf16_compress_hook();

struct ReducerOptions {
  BucketPlanOptions buckets;
  // Parameters may get no gradient in some iterations (branches): those the
  // adapter reports unused, and any still missing at the end of backward,
  // contribute zeros. Without it, a missing gradient is an error reported at
  // the next forward.
  bool find_unused_parameters = false;
  // The graph and the set of used parameters never change: the first
  // iteration's observations are reused (no search for unused parameters,
  // and a parameter may be marked ready several times per backward, as
  // with re-entrant activation checkpointing).
  bool static_graph = false;
  // Parameter gradients are views into the buckets: no copies in or out,
  // one copy of the gradients in memory, but the collectives write into the
  // gradients while backward runs. Without it the reducer keeps two sets of
  // buckets: each backward reduces from the set the gradients live in into
  // the other, and finalize points the gradients at the result, so no
  // gradient memory is written except by the framework's accumulation and
  // by finalize (see reducer.cc).
  bool gradient_as_bucket_view = false;
  // After the first synchronised iteration, re-plan buckets in the order
  // gradients actually became ready (rank 0's order, shared with all).
  bool rebuild_buckets = true;
  std::shared_ptr<CommHook> comm_hook;  // null: allreduce_hook()
  // Choose bucket_cap_bytes from measurements instead of taking it as
  // given: after `autotune_iterations` synchronised iterations (the first
  // left out as warm-up when there are more) the ranks time a few
  // all-reduces, combine when each gradient became ready, and re-plan the
  // buckets once (in the observed order, as the rebuild does) with the cap
  // the step model predicts to leave the least communication exposed.
  // Collective and identical on every rank; see bucket_autotune().
  bool autotune_bucket_cap = false;
  std::size_t autotune_iterations = 3;
};

// What bucket autotuning measured and chose.
struct BucketAutotune {
  std::size_t bucket_cap_bytes = 0;      // chosen: the buckets are planned with it
  std::size_t configured_cap_bytes = 0;  // the cap of the measured iterations
  std::size_t buckets = 0;               // planned with the chosen cap
  double predicted_exposed_ms = 0;       // communication after backward, predicted with the chosen cap
  double configured_exposed_ms = 0;      // ... and with the configured one
  double backward_ms = 0;                // measured, slowest rank
  double alpha_us = 0;                   // all-reduce cost in the step: per message ...
  double beta_us_per_byte = 0;           // ... and per byte on the wire
  double contention = 1;                 // in-step bucket time / the idle probe's prediction (in alpha and beta)
  std::string algorithm;                 // the cost model's algorithm for the group's backend
};

// Timings of one backward pass (steady-clock microseconds; see now_us).
struct BucketTiming {
  std::size_t bytes = 0;
  std::int64_t launched_us = 0;   // handed to the group
  std::int64_t started_us = 0;    // the collective began
  std::int64_t finished_us = 0;   // the collective ended
  // Time backward stood still in this bucket's collective: a small one runs
  // to completion on the thread that launches it (see ProcessGroup), which
  // during backward is the autograd thread, so none of it is hidden.
  std::int64_t blocked_us = 0;
};

struct StepStats {
  std::uint64_t iteration = 0;
  bool synchronised = false;
  std::int64_t backward_start_us = 0;  // prepare_for_backward (end of forward)
  std::int64_t backward_end_us = 0;    // finalize began: backward compute is over
  std::int64_t finalize_end_us = 0;    // gradients written back
  std::vector<BucketTiming> buckets;
  // Communication the step waited for: after backward ended, and inside
  // backward while a bucket's collective blocked it.
  double exposed_communication_ms() const { return (finalize_end_us - backward_end_us + blocked_us()) / 1000.0; }
  // Backward's own compute (without the blocked time).
  double backward_ms() const { return (backward_end_us - backward_start_us - blocked_us()) / 1000.0; }
  std::int64_t blocked_us() const;
  std::size_t bytes() const;
};

class Reducer {
 public:
  // Collective: every rank constructs its Reducer with the same parameters
  // (the same plan follows) at the same point.
  Reducer(std::shared_ptr<ProcessGroup> pg, std::vector<ParamSpec> params, GradientSource& gradients,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Collective, at the start of forward: rebuilds the buckets once, after
  // the first synchronised iteration. Returns whether it did.
  bool maybe_rebuild_buckets();
  // Throws InvalidArgument naming the parameters (per rank) that got no
  // gradient in the previous iteration, when find_unused_parameters is off.
  void check_previous_iteration();
  // End of forward. `unused` (only with find_unused_parameters): parameters
  // that will get no gradient; they are ready at once, with zeros.
  void prepare_for_backward(const std::vector<std::size_t>& unused = {});
  // Parameter i's gradient is final for this backward.
  void mark_ready(std::size_t i);
  // End of backward: launches what is left, waits, writes gradients back.
  void finalize();

  // Uneven inputs (lockstep::torch::Join). On a rank that has run out of
  // data: issues the collectives of one synchronised backward with zero
  // gradients, bucket by bucket through the comm hook, as the ranks still
  // training do, and waits for them. This rank's gradients then hold the
  // averages, as the others' do after finalize() (a rank that joined may
  // still step an optimizer on them: ZeroRedundancyOptimizer updates its
  // shard).
  void shadow_backward();
  // The next synchronised (or shadowed) backward's averages divide by
  // `ranks` (the ranks that still train) instead of the group's size: the
  // others contributed zeros. 0 or the group's size: the plain average.
  void set_contributing_ranks(int ranks) { contributing_ranks_ = ranks; }

  // Replaces the comm hook (null: allreduce_hook()). Only before the first
  // backward: InvalidArgument afterwards, or for a hook that cannot reduce
  // buckets in the gradients' memory.
  void set_comm_hook(std::shared_ptr<CommHook> hook);
  const CommHook& comm_hook() const { return *options_.comm_hook; }

  // Under no_sync (sync false), backward passes only accumulate locally; the
  // next synchronised backward reduces the accumulated gradients.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Where parameter i's gradient goes in its bucket for the next
  // synchronised backward (where it already lives after a finalize, unless
  // the framework replaced it).
  void* bucket_slot(std::size_t i) const;
  const StepStats& last_step() const { return last_step_; }
  bool buckets_rebuilt() const { return rebuilt_; }
  // The cap the buckets are planned with (the chosen one once autotuning ran).
  std::size_t bucket_cap_bytes() const { return options_.buckets.bucket_cap_bytes; }
  // Set once autotuning has chosen (ReducerOptions::autotune_bucket_cap).
  const std::optional<BucketAutotune>& bucket_autotune() const { return autotune_; }
  // Backward passes finished so far (synchronised or not).
  std::uint64_t iterations() const;
  ProcessGroup& group() const { return *pg_; }

 private:
  struct State;
  void allocate_buckets();
  void launch_ready_buckets();
  void launch(std::size_t b);
  void force_missing();
  void zero_slot(std::size_t i);
  bool double_buffered() const;
  int output_set() const;
  std::byte* slot_in(int set, std::size_t i) const;
  std::shared_ptr<void> owner(int set, std::size_t i) const;
  std::size_t trailer_elements() const;
  bool solo() const;
  void* stream() const;
  GradBucket grad_bucket(std::size_t b, void* input, void* output, std::size_t count, void* stream) const;
  void report_missing(double flag, std::uint64_t iteration);
  void take_pending_flags();
  void finish_iteration();
  void check_comm_hook(const CommHook& hook) const;
  void deliver_shadowed(const std::vector<std::shared_ptr<std::byte[]>>& results);
  bool measuring() const;
  void record_timeline();

  std::shared_ptr<ProcessGroup> pg_;
  std::vector<ParamSpec> params_;
  GradientSource& gradients_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  bool sync_ = true;
  bool rebuilt_ = false;
  int contributing_ranks_ = 0;
  std::optional<BucketAutotune> autotune_;
  StepStats last_step_;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep
