// The Reducer; see lockstep/reducer.h.
//
// Per synchronised backward, step by step:
//   1. prepare_for_backward: parameters known to be unused are ready at once
//      (their slots zeroed).
//   2. mark_ready(i): copy the gradient into its slot (nothing to copy when
//      it already lives there); when a bucket's last parameter is ready,
//      launch every bucket that is complete, in bucket order, so all ranks
//      issue the same collectives in the same order.
//   3. finalize: parameters still missing contribute zeros (an error for the
//      next forward, unless find_unused_parameters); the remaining buckets
//      are launched; all are waited for; gradients are pointed at the
//      averages.
// In a world of one the gradients already are the average: the same
// bookkeeping and checks run, but no data moves.
//
// Two sets of buckets (unless gradient_as_bucket_view): each synchronised
// backward reduces out of place, from the "input" set into the other, and
// finalize points every gradient at its slot in the other set, which then
// becomes the input set. From the second step on the framework accumulates
// straight into the input set, so no gradient is copied in or out, and yet
// no gradient memory is written by a collective while backward runs: the
// collectives write only into the set no gradient points at. (A gradient
// that must keep its values while its input slot is reused, e.g. one unused
// on every rank, is first moved into memory of its own.)
//
// CUDA gradients (GradientSource::device()): the buckets are device memory
// and every copy, zeroing and collective is queued on the framework's
// current stream (detail::BucketMemory), so the step never waits on the
// host. finalize() makes its own current stream wait for the collectives
// (Work::wait) and reads the last bucket's flags back asynchronously: the
// missing-gradient report is read at the first forward that finds the copy
// landed (at the latest at the next finalize). Only find_unused_parameters reads the flags at once (it
// needs them to know which gradients to point at the averages), which is a
// host synchronisation per step, as in PyTorch's reducer.
//
// Reporting missing gradients without hanging: the last bucket carries one
// extra element, a flag each rank sets to 1 if it had to fill in missing
// gradients. It is averaged with the bucket, so after the step every rank
// knows whether any rank had such parameters; their names were put in the
// store before the flag was sent, and the next forward reports them all.
//
// With find_unused_parameters the last bucket also carries one element per
// parameter: 1 where this rank produced a gradient. A parameter unused on
// every rank keeps its gradient as it was (as in PyTorch), so optimizers
// skip it rather than step on a gradient of zeros. The last bucket is
// launched only when every parameter is ready or known unused, so both
// trailers are final by then; no extra collective is needed.
#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>

#include "common/clock.h"
#include "ddp/bucket_autotune.h"
#include "ddp/bucket_memory.h"
#include "lockstep/error.h"
#include "lockstep/reducer.h"

namespace lockstep {
namespace {

// The flags after the last bucket's gradients: [0] missing-gradient, [1 + i]
// parameter i produced a gradient (find_unused_parameters only).
constexpr std::size_t kMissingFlag = 0;

}  // namespace

std::int64_t StepStats::blocked_us() const {
  std::int64_t total = 0;
  for (const auto& b : buckets) total += b.blocked_us;
  return total;
}

std::size_t StepStats::bytes() const {
  std::size_t total = 0;
  for (const auto& b : buckets) total += b.bytes;
  return total;
}

struct Reducer::State {
  std::unique_ptr<detail::BucketMemory> memory;  // host or the gradients' device
  std::string store_prefix;                          // "ddp/<instance>"
  std::array<std::vector<std::shared_ptr<std::byte[]>>, 2> storage;  // [set][bucket]
  int input_set = 0;  // the set the next synchronised backward reduces from
  std::vector<std::pair<std::size_t, std::size_t>> where;  // param -> (bucket, element offset)

  // The current backward.
  bool prepared = false;
  std::vector<int> calls;  // mark_ready calls per parameter
  std::vector<bool> ready;
  std::vector<std::size_t> pending;  // parameters not yet ready, per bucket
  std::size_t next_launch = 0;
  std::vector<std::shared_ptr<Work>> works;
  std::vector<GradBucket> launched;  // what each bucket's hook was given (for its finish())
  std::vector<BucketTiming> timings;
  std::vector<std::size_t> ready_order;
  std::vector<std::size_t> missing;  // filled with zeros although not declared unused
  std::vector<bool> produced;        // a gradient arrived through mark_ready
  std::vector<std::int64_t> ready_us;  // while autotuning measures: when each gradient became ready

  // Across iterations.
  std::uint64_t iterations = 0;  // backward passes finished
  bool synced_once = false;
  std::size_t synced_iterations = 0;  // synchronised backward passes (shadowed ones included)
  // Autotuning's measurements, summed over the iterations it measures.
  std::vector<double> ready_ms_sum;
  std::vector<double> bucket_us_sum;  // per bucket: its all-reduce inside the step
  double backward_ms_sum = 0;
  std::size_t measured_iterations = 0;
  std::vector<std::size_t> first_ready_order;  // of the first synchronised iteration
  std::vector<int> expected_calls;            // static_graph: from the first iteration
  bool static_learned = false;
  std::string pending_error;  // reported at the next forward
  // The last bucket's flags, on their way back from device memory: read
  // at the next forward (take_pending_flags), for iteration pending_iteration.
  std::unique_ptr<detail::ValuesReadBack> pending_flags;
  std::uint64_t pending_iteration = 0;
  bool pending_mismatch = false;  // pending_error is a MismatchError, not an InvalidArgument
};

Reducer::Reducer(std::shared_ptr<ProcessGroup> pg, std::vector<ParamSpec> params, GradientSource& gradients,
                 ReducerOptions options)
    : pg_(std::move(pg)),
      params_(std::move(params)),
      gradients_(gradients),
      options_(std::move(options)),
      state_(std::make_unique<State>()) {
  if (!options_.comm_hook) options_.comm_hook = allreduce_hook();
  // The k-th reducer a rank creates on this group is the k-th on every rank.
  const auto instance = pg_->store()->add(fmt::format("ddp/instances/{}", pg_->rank()), 1);
  state_->store_prefix = fmt::format("ddp/{}", instance);
  check_comm_hook(*options_.comm_hook);
  state_->memory = detail::bucket_memory_for(gradients_.device());
  buckets_ = plan_buckets(params_, reverse_order(params_.size()), options_.buckets);
  allocate_buckets();
  state_->calls.assign(params_.size(), 0);
  state_->ready.assign(params_.size(), false);
}

void Reducer::check_comm_hook(const CommHook& hook) const {
  if (!hook.supports(gradients_.device()))
    throw InvalidArgument(fmt::format(
        "the communication hook {} cannot reduce gradients on {}; use the allreduce, fp16_compress, bf16_compress, "
        "powersgd or batched_powersgd hook there, or keep the model in host memory",
        hook.name(), to_string(gradients_.device())));
}

void Reducer::set_comm_hook(std::shared_ptr<CommHook> hook) {
  if (!hook) hook = allreduce_hook();
  if (state_->iterations > 0 || state_->prepared || state_->synced_once)
    throw InvalidArgument(fmt::format("the communication hook cannot change after the first backward pass ({} so "
                                      "far); set it before training starts",
                                      state_->iterations));
  check_comm_hook(*hook);
  options_.comm_hook = std::move(hook);
}

Reducer::~Reducer() {
  // Collectives may still read the buckets: let them finish first.
  for (auto& w : state_->works) {
    if (!w) continue;
    try {
      w->wait();
    } catch (const std::exception&) {
      // The error was or will be reported by whoever waited on purpose.
    }
  }
}

void Reducer::allocate_buckets() {
  auto& s = *state_;
  s.where.assign(params_.size(), {0, 0});
  s.input_set = 0;
  for (int set = 0; set < 2; ++set) {
    s.storage[set].clear();
    if (set == 1 && !double_buffered()) continue;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const Bucket& bucket = buckets_[b];
      const bool last = b + 1 == buckets_.size();
      // Collective on every rank in the same order (ProcessGroup::allocate_shared).
      s.storage[set].push_back(s.memory->allocate_bucket(
          *pg_, (bucket.count + (last ? trailer_elements() : 0)) * dtype_size(bucket.dtype)));
    }
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    for (std::size_t k = 0; k < buckets_[b].params.size(); ++k) s.where[buckets_[b].params[k]] = {b, buckets_[b].offsets[k]};
  // Existing gradients become views (as PyTorch's reducer does); a missing
  // one stays missing until backward produces it (mark_ready).
  if (options_.gradient_as_bucket_view)
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (gradients_.has_gradient(i)) gradients_.use_as_gradient(i, bucket_slot(i), owner(0, i));
}

bool Reducer::double_buffered() const { return !options_.gradient_as_bucket_view && !solo(); }

int Reducer::output_set() const { return double_buffered() ? 1 - state_->input_set : state_->input_set; }

std::byte* Reducer::slot_in(int set, std::size_t i) const {
  const auto [b, offset] = state_->where[i];
  return state_->storage[set][b].get() + offset * dtype_size(buckets_[b].dtype);
}

// What keeps parameter i's slot in `set` alive while a gradient points at it.
std::shared_ptr<void> Reducer::owner(int set, std::size_t i) const {
  const auto& bucket = state_->storage[set][state_->where[i].first];
  return std::shared_ptr<void>(bucket, bucket.get());
}

// Parameter i contributes zeros this iteration. Its gradient keeps its
// values (with bucket views it is the slot, and becomes zero, as in PyTorch).
void Reducer::zero_slot(std::size_t i) {
  void* slot = bucket_slot(i);
  if (double_buffered()) gradients_.move_out_of(i, slot);
  state_->memory->zero(slot, params_[i].count * dtype_size(params_[i].dtype), stream());
}

std::uint64_t Reducer::iterations() const { return state_->iterations; }

bool Reducer::solo() const { return pg_->size() == 1; }

void* Reducer::stream() const { return gradients_.current_stream(); }

GradBucket Reducer::grad_bucket(std::size_t b, void* input, void* output, std::size_t count, void* stream) const {
  const Bucket& bucket = buckets_[b];
  const Device device = state_->memory->device();
  return GradBucket{b, Buffer{output, count, bucket.dtype, device, stream}, b + 1 == buckets_.size(),
                    ConstBuffer{input, count, bucket.dtype, device, stream}, &bucket, &params_};
}

// Elements after the last bucket's gradients: the missing-gradient flag,
// and with find_unused_parameters a used flag per parameter.
std::size_t Reducer::trailer_elements() const {
  return 1 + (options_.find_unused_parameters ? params_.size() : 0);
}

void* Reducer::bucket_slot(std::size_t i) const { return slot_in(state_->input_set, i); }

bool Reducer::maybe_rebuild_buckets() {
  auto& s = *state_;
  const bool tune = options_.autotune_bucket_cap && !solo();
  if (rebuilt_ || !(options_.rebuild_buckets || tune) || !s.synced_once) return false;
  if (tune && s.synced_iterations < options_.autotune_iterations) return false;
  rebuilt_ = true;
  // Rank 0's observed order, shared with everyone, so all plan alike.
  std::vector<std::int64_t> order(params_.size());
  std::vector<bool> listed(params_.size(), false);
  std::size_t k = 0;
  for (std::size_t i : s.first_ready_order) {
    order[k++] = static_cast<std::int64_t>(i);
    listed[i] = true;
  }
  for (std::size_t i : reverse_order(params_.size()))
    if (!listed[i]) order[k++] = static_cast<std::int64_t>(i);
  pg_->broadcast(view(std::span(order)), 0)->wait();
  std::vector<std::size_t> agreed(order.begin(), order.end());
  if (tune) {
    GradientTimeline mine;
    const double iterations = static_cast<double>(std::max<std::size_t>(1, s.measured_iterations));
    mine.backward_ms = s.backward_ms_sum / iterations;
    for (double sum : s.ready_ms_sum) mine.ready_ms.push_back(sum / iterations);
    s.bucket_us_sum.resize(buckets_.size(), 0.0);
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      mine.buckets.push_back({static_cast<double>(buckets_[b].bytes()), s.bucket_us_sum[b] / iterations});
    const std::string hook = options_.comm_hook->name();
    const double wire_fraction = hook == "fp16_compress" || hook == "bf16_compress" ? 0.5 : 1.0;
    autotune_ = autotune_bucket_cap(*pg_, params_, agreed, mine, options_.buckets, wire_fraction);
    options_.buckets.bucket_cap_bytes = autotune_->bucket_cap_bytes;
  }
  std::vector<Bucket> plan = plan_buckets(params_, agreed, options_.buckets);
  if (autotune_) autotune_->buckets = plan.size();
  bool same = plan.size() == buckets_.size();
  for (std::size_t b = 0; same && b < plan.size(); ++b) same = plan[b].params == buckets_[b].params;
  if (same) return false;
  // Views live in the old buckets and may hold values: carry them over.
  // Otherwise gradients that point into the old buckets keep them alive
  // until they are copied into the new ones at the next backward. A
  // gradient the framework dropped stays dropped (not revived with the old
  // values, which backward would then accumulate onto).
  void* here = stream();
  std::vector<std::shared_ptr<std::byte[]>> saved(options_.gradient_as_bucket_view ? params_.size() : 0);
  for (std::size_t i = 0; i < saved.size(); ++i) {
    if (!gradients_.has_gradient(i)) continue;
    const std::size_t bytes = params_[i].count * dtype_size(params_[i].dtype);
    saved[i] = s.memory->allocate_scratch(bytes, here);
    s.memory->copy(saved[i].get(), gradients_.gradient(i), bytes, here);
  }
  buckets_ = std::move(plan);
  allocate_buckets();
  for (std::size_t i = 0; i < saved.size(); ++i)
    if (saved[i]) s.memory->copy(bucket_slot(i), saved[i].get(), params_[i].count * dtype_size(params_[i].dtype), here);
  return true;
}

void Reducer::check_previous_iteration() {
  // Flags still on their way from the device are read at a later forward
  // (or by finalize) rather than waited for: the host keeps running ahead.
  if (state_->pending_flags && state_->pending_flags->ready()) take_pending_flags();
  if (state_->pending_error.empty()) return;
  std::string message = std::move(state_->pending_error);
  state_->pending_error.clear();
  if (state_->pending_mismatch) throw MismatchError(message);
  throw InvalidArgument(message);
}

void Reducer::prepare_for_backward(const std::vector<std::size_t>& unused) {
  auto& s = *state_;
  if (!sync_) return;
  s.prepared = true;
  last_step_ = StepStats{};
  last_step_.iteration = s.iterations;
  last_step_.synchronised = true;
  last_step_.backward_start_us = now_us();
  s.calls.assign(params_.size(), 0);
  s.ready.assign(params_.size(), false);
  s.pending.assign(buckets_.size(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) s.pending[b] = buckets_[b].params.size();
  s.next_launch = 0;
  s.works.assign(buckets_.size(), nullptr);
  s.launched.assign(buckets_.size(), GradBucket{});
  s.timings.assign(buckets_.size(), BucketTiming{});
  s.ready_order.clear();
  s.missing.clear();
  s.produced.assign(params_.size(), false);
  if (measuring()) s.ready_us.assign(params_.size(), 0);
  std::vector<std::size_t> declared = unused;
  if (options_.static_graph && s.static_learned) {
    declared.clear();
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (s.expected_calls[i] == 0) declared.push_back(i);
  } else if (!options_.find_unused_parameters) {
    declared.clear();
  }
  for (std::size_t i : declared) {
    if (i >= params_.size() || s.ready[i]) continue;
    zero_slot(i);
    s.ready[i] = true;
    if (measuring()) s.ready_us[i] = last_step_.backward_start_us;
    --s.pending[s.where[i].first];
  }
  launch_ready_buckets();
}

void Reducer::mark_ready(std::size_t i) {
  auto& s = *state_;
  if (!sync_) return;
  if (i >= params_.size()) throw InvalidArgument(fmt::format("mark_ready({}): there are {} parameters", i, params_.size()));
  if (!s.prepared) prepare_for_backward();
  const int calls = ++s.calls[i];
  if (calls == 1) {
    s.ready_order.push_back(i);
    if (measuring()) s.ready_us[i] = now_us();
  }
  // The first iteration of a static graph only learns how often each
  // gradient arrives; its buckets all go at the end.
  if (options_.static_graph && !s.static_learned) return;
  const int needed = options_.static_graph ? s.expected_calls[i] : 1;
  if (calls < needed) return;
  if (calls > needed || s.ready[i])
    throw InvalidArgument(fmt::format(
        "parameter '{}' received its gradient {} times in one backward pass (e.g. re-entrant activation "
        "checkpointing, or a module used twice with a gradient hook in between); set static_graph=true if the "
        "graph is the same every iteration",
        params_[i].name, calls));
  const std::size_t bytes = params_[i].count * dtype_size(params_[i].dtype);
  void* slot = bucket_slot(i);
  void* grad = gradients_.gradient(i);
  if (grad != slot && !solo()) {
    s.memory->copy(slot, grad, bytes, stream());
    if (options_.gradient_as_bucket_view) gradients_.use_as_gradient(i, slot, owner(s.input_set, i));
  }
  s.ready[i] = true;
  s.produced[i] = true;
  --s.pending[s.where[i].first];
  launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  auto& s = *state_;
  while (s.next_launch < buckets_.size() && s.pending[s.next_launch] == 0) launch(s.next_launch++);
}

void Reducer::launch(std::size_t b) {
  auto& s = *state_;
  const Bucket& bucket = buckets_[b];
  const bool last = b + 1 == buckets_.size();
  std::size_t count = bucket.count;
  if (last) {
    if (!s.missing.empty()) {
      std::string names;
      for (std::size_t i : s.missing) names += fmt::format("{}{}", names.empty() ? "" : ", ", params_[i].name);
      pg_->store()->set(fmt::format("{}/missing/{}/{}", s.store_prefix, s.iterations, pg_->rank()), names);
    }
    std::vector<double> flags(trailer_elements(), 0.0);
    flags[kMissingFlag] = s.missing.empty() ? 0.0 : 1.0;
    if (options_.find_unused_parameters)
      for (std::size_t i = 0; i < params_.size(); ++i) flags[1 + i] = s.produced[i] ? 1.0 : 0.0;
    s.memory->write(s.storage[s.input_set][b].get() + count * dtype_size(bucket.dtype), bucket.dtype, flags, stream());
    count += trailer_elements();
  }
  BucketTiming& timing = s.timings[b];
  timing.bytes = bucket.bytes();
  timing.launched_us = now_us();
  if (solo()) {  // a world of one: the gradients already are the average
    timing.started_us = timing.finished_us = timing.launched_us;
    return;
  }
  void* here = stream();
  std::byte* input = s.storage[s.input_set][b].get();
  std::byte* output = s.storage[output_set()][b].get();
  if (input != output && !options_.comm_hook->out_of_place()) {
    s.memory->copy(output, input, count * dtype_size(bucket.dtype), here);
    input = output;
  }
  s.launched[b] = grad_bucket(b, input, output, count, here);
  s.works[b] = options_.comm_hook->run(*pg_, s.launched[b]);
  if (s.works[b]->done()) {
    // It ran to completion on this thread (a small operation on an idle
    // group): timed here, precisely. Inside backward (finalize has not
    // begun) that time stalled backward.
    timing.started_us = timing.launched_us;
    timing.finished_us = now_us();
    if (last_step_.backward_end_us == 0) timing.blocked_us = timing.finished_us - timing.launched_us;
  } else {
    // The Work's own issue time: on the same clock as its start and finish.
    timing.launched_us = std::min(timing.launched_us, s.works[b]->issued_us());
  }
  pg_->annotate(s.works[b]->seq(), fmt::format("bucket {}", b));
}

// Parameters that never got a gradient: zeros, and (unless expected) a
// record for the report at the next forward.
void Reducer::force_missing() {
  auto& s = *state_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (s.ready[i]) continue;
    if (options_.static_graph && !s.static_learned && s.calls[i] > 0) {
      // First static iteration: the gradient is there, just not counted yet.
      const std::size_t bytes = params_[i].count * dtype_size(params_[i].dtype);
      void* grad = gradients_.gradient(i);
      if (grad != bucket_slot(i) && !solo()) s.memory->copy(bucket_slot(i), grad, bytes, stream());
      s.produced[i] = true;
    } else {
      if (!solo()) zero_slot(i);
      const bool expected = options_.find_unused_parameters || (options_.static_graph && !s.static_learned);
      if (!expected) s.missing.push_back(i);
    }
    s.ready[i] = true;
    --s.pending[s.where[i].first];
  }
}

void Reducer::finalize() {
  auto& s = *state_;
  if (!sync_) {
    ++s.iterations;
    last_step_ = StepStats{};
    last_step_.iteration = s.iterations - 1;
    last_step_.synchronised = false;
    return;
  }
  if (!s.prepared) prepare_for_backward();
  last_step_.backward_end_us = now_us();
  force_missing();
  launch_ready_buckets();
  // Work queued on this thread's stream from here on (the optimizer's step)
  // sees the averages: each wait orders the bucket's launch stream after
  // its collective, and that stream is ordered before ours.
  void* here = stream();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (!s.works[b]) continue;  // nothing was sent (a world of one)
    s.works[b]->wait();
    s.memory->order(s.launched[b].buffer.stream, here);
    GradBucket waited = s.launched[b];
    waited.buffer.stream = waited.input.stream = here;
    options_.comm_hook->finish(waited);
    if (s.timings[b].finished_us != 0) continue;  // timed at launch
    s.timings[b].started_us = s.works[b]->started_us();
    s.timings[b].finished_us = s.works[b]->finished_us();
  }
  const int out = output_set();
  if (contributing_ranks_ > 0 && contributing_ranks_ != pg_->size()) {
    // The hook averaged over the whole group; ranks that joined sent zeros.
    const double factor = static_cast<double>(pg_->size()) / contributing_ranks_;
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      s.memory->scale(s.storage[out][b].get(), buckets_[b].count, buckets_[b].dtype, factor, here);
  }
  contributing_ranks_ = 0;
  if (!buckets_.empty()) {
    const Bucket& last = buckets_.back();
    take_pending_flags();  // a report nobody asked for yet is not overwritten
    if (solo()) {
      report_missing(s.missing.empty() ? 0.0 : 1.0, s.iterations);
    } else {
      auto flags = s.memory->read(s.storage[out].back().get() + last.count * dtype_size(last.dtype), last.dtype,
                                  trailer_elements(), here);
      if (double_buffered() && options_.find_unused_parameters) {
        // Which gradients to point at the averages depends on the flags:
        // read them now (on CUDA, the host waits for the last bucket).
        const std::vector<double> values = flags->values(pg_->timeout());
        for (std::size_t i = 0; i < params_.size(); ++i)
          if (values[1 + i] != 0) gradients_.use_as_gradient(i, slot_in(out, i), owner(out, i));
        s.input_set = out;
        report_missing(values[kMissingFlag], s.iterations);
      } else {
        s.pending_flags = std::move(flags);
        s.pending_iteration = s.iterations;
      }
    }
  }
  if (double_buffered() && s.input_set != out) {
    for (std::size_t i = 0; i < params_.size(); ++i) gradients_.use_as_gradient(i, slot_in(out, i), owner(out, i));
    s.input_set = out;
  }
  finish_iteration();
}

// The last bucket's flags of an earlier iteration, if still unread: the
// report of missing gradients (or of buckets that did not line up).
void Reducer::take_pending_flags() {
  auto& s = *state_;
  if (!s.pending_flags) return;
  auto flags = std::move(s.pending_flags);
  report_missing(flags->values(pg_->timeout())[kMissingFlag], s.pending_iteration);
}

// `flag`: the averaged missing-gradient flag of `iteration`. Non-zero: the
// report for the next forward, naming every rank's missing parameters.
void Reducer::report_missing(double flag, std::uint64_t iteration) {
  auto& s = *state_;
  if (flag == 0 || options_.find_unused_parameters) return;
  std::string report;
  for (int r = 0; r < pg_->size(); ++r) {
    const std::string key = fmt::format("{}/missing/{}/{}", s.store_prefix, iteration, r);
    if (pg_->store()->check({key})) report += fmt::format("\n  rank {}: {}", r, pg_->store()->get(key));
  }
  // No rank said it missed a gradient, yet the flag came back set: what
  // was summed there was not the flag on every rank, so the ranks'
  // buckets (or their collectives) do not line up.
  s.pending_mismatch = report.empty();
  s.pending_error =
      report.empty()
          ? fmt::format(
                "rank {}/{}: in iteration {}, the ranks' gradient buckets did not line up: the last bucket's "
                "missing-gradient flag came back set though no rank missed a gradient, so the all-reduces "
                "paired different data. The ranks use different models, bucket sizes or DDP options, or one "
                "issued a collective the others did not; the gradients of this iteration are wrong.",
                pg_->rank(), pg_->size(), iteration)
          : fmt::format(
                "rank {}/{}: in iteration {}, these parameters received no gradient (they were not used to "
                "compute the loss):{}\nEvery parameter must take part in the loss on every rank, or construct "
                "DistributedDataParallel with find_unused_parameters=true so that missing gradients count as "
                "zeros.",
                pg_->rank(), pg_->size(), iteration, report);
}

// The collectives of launch(), in bucket order, on zeros: what this rank
// would send had it no gradients. The trailer is zero too (no missing
// gradient, no parameter used), so it changes nothing for the others.
void Reducer::shadow_backward() {
  auto& s = *state_;
  if (solo()) return;
  void* here = stream();
  std::vector<std::shared_ptr<std::byte[]>> zeros(buckets_.size()), results(buckets_.size());
  std::vector<GradBucket> launched(buckets_.size());
  std::vector<std::shared_ptr<Work>> works(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const std::size_t count = bucket.count + (b + 1 == buckets_.size() ? trailer_elements() : 0);
    results[b] = s.memory->allocate_scratch(count * dtype_size(bucket.dtype), here);
    std::byte* input = results[b].get();
    if (options_.comm_hook->out_of_place()) {
      zeros[b] = s.memory->allocate_scratch(count * dtype_size(bucket.dtype), here);
      input = zeros[b].get();
    }
    launched[b] = grad_bucket(b, input, results[b].get(), count, here);
    works[b] = options_.comm_hook->run(*pg_, launched[b]);
    pg_->annotate(works[b]->seq(), fmt::format("bucket {} (joined: zeros)", b));
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    works[b]->wait();
    s.memory->order(launched[b].buffer.stream, here);
    GradBucket waited = launched[b];
    waited.buffer.stream = waited.input.stream = here;
    options_.comm_hook->finish(waited);
  }
  deliver_shadowed(results);
  // The ranks still training rebuild their buckets after their first
  // synchronised backward; a rank that joined before its first one must
  // take part in that rebuild (with rank 0's order, like everyone).
  s.synced_once = true;
  ++s.synced_iterations;
}

// Whether this synchronised backward's timeline goes into autotuning: the
// iterations before it runs, the first (warm-up) left out when there are
// more.
bool Reducer::measuring() const {
  const auto& s = *state_;
  if (!options_.autotune_bucket_cap || autotune_ || rebuilt_ || solo()) return false;
  return s.synced_iterations < options_.autotune_iterations &&
         (s.synced_iterations > 0 || options_.autotune_iterations <= 1);
}

// The averages a shadowed backward brought, written into this rank's
// gradients as finalize() gives them to the ranks still training (scaled
// the same way; a parameter no rank used keeps its gradient), so that an
// optimizer stepping on this rank (ZeroRedundancyOptimizer's join hook)
// steps on the same gradients as theirs.
void Reducer::deliver_shadowed(const std::vector<std::shared_ptr<std::byte[]>>& results) {
  const auto& s = *state_;
  void* here = stream();
  const int contributing = contributing_ranks_;
  contributing_ranks_ = 0;
  if (contributing > 0 && contributing != pg_->size())
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      s.memory->scale(results[b].get(), buckets_[b].count, buckets_[b].dtype,
                      static_cast<double>(pg_->size()) / contributing, here);
  std::vector<double> used;
  if (options_.find_unused_parameters && !buckets_.empty()) {
    const Bucket& last = buckets_.back();
    used = s.memory->read(results.back().get() + last.count * dtype_size(last.dtype), last.dtype,
                          trailer_elements(), here)->values(pg_->timeout());
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    for (std::size_t k = 0; k < bucket.params.size(); ++k) {
      const std::size_t i = bucket.params[k];
      if (!used.empty() && used[1 + i] == 0) continue;
      s.memory->copy(gradients_.gradient(i), results[b].get() + bucket.offsets[k] * dtype_size(bucket.dtype),
                     params_[i].count * dtype_size(params_[i].dtype), here);
    }
  }
}

// Adds this backward's ready times (a gradient that never came: at the end
// of backward) and its length to autotuning's sums.
void Reducer::record_timeline() {
  auto& s = *state_;
  const std::int64_t start = last_step_.backward_start_us, end = last_step_.backward_end_us;
  s.ready_ms_sum.resize(params_.size(), 0.0);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t at = i < s.ready_us.size() && s.ready_us[i] != 0 ? s.ready_us[i] : end;
    s.ready_ms_sum[i] += static_cast<double>(std::clamp(at, start, end) - start) / 1000.0;
  }
  s.backward_ms_sum += static_cast<double>(end - start) / 1000.0;
  s.bucket_us_sum.resize(buckets_.size(), 0.0);
  for (std::size_t b = 0; b < buckets_.size() && b < s.timings.size(); ++b)
    s.bucket_us_sum[b] += static_cast<double>(s.timings[b].finished_us - s.timings[b].started_us);
  ++s.measured_iterations;
}

void Reducer::finish_iteration() {
  auto& s = *state_;
  if (options_.static_graph && !s.static_learned) {
    s.expected_calls = s.calls;
    s.static_learned = true;
  }
  if (!s.synced_once) {
    s.first_ready_order = s.ready_order;
    s.synced_once = true;
  }
  if (measuring()) record_timeline();
  ++s.synced_iterations;
  last_step_.finalize_end_us = now_us();
  last_step_.buckets = s.timings;
  s.works.assign(buckets_.size(), nullptr);
  s.prepared = false;
  ++s.iterations;
}

}  // namespace lockstep
