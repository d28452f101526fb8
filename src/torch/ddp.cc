// DistributedDataParallel for libtorch: autograd hooks, the search for unused
// parameters, buffer broadcast and the bridge between param.grad() and the
// Reducer's buckets. See lockstep/torch/ddp.h.
#include "lockstep/torch/ddp.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <cmath>
#include <fstream>
#include <optional>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "common/clock.h"
#include "common/file.h"
#include "common/log.h"
#include "cuda_stream.h"
#include "libtorch_version.h"
#include "lockstep/error.h"

namespace lockstep::torch {
namespace {

namespace autograd = ::torch::autograd;

// param.grad() as the Reducer needs it: contiguous, created on demand, and
// re-pointable into a bucket; on the parameters' device, computed on
// libtorch's current stream there.
class TorchGradients final : public GradientSource {
 public:
  TorchGradients(std::vector<::torch::Tensor> params, c10::Device device)
      : params_(std::move(params)), device_(device) {}

  Device device() const override { return device_.is_cuda() ? Device::cuda(device_.index()) : Device::host(); }
  void* current_stream() const override { return lockstep::torch::current_stream(device_); }

  void* gradient(std::size_t i) override {
    ::torch::Tensor& p = params_[i];
    ::torch::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) {
      grad = ::torch::zeros_like(p, ::torch::MemoryFormat::Contiguous);
    } else if (!grad.is_contiguous()) {
      grad = grad.contiguous();
    }
    return grad.data_ptr();
  }

  bool has_gradient(std::size_t i) const override { return params_[i].grad().defined(); }

  void use_as_gradient(std::size_t i, void* slot, std::shared_ptr<void> owner) override {
    ::torch::Tensor& p = params_[i];
    point_at(p.mutable_grad(), ::torch::from_blob(slot, p.sizes(), [owner = std::move(owner)](void*) {},
                                                  p.options().requires_grad(false)));
  }

  void move_out_of(std::size_t i, const void* slot) override {
    ::torch::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined() && grad.data_ptr() == slot) point_at(grad, grad.clone(::torch::MemoryFormat::Contiguous));
  }

 private:
  // Makes `grad` hold `memory`. Keeps the gradient tensor itself (code
  // holding it sees the new values) unless it may not change storage:
  // autograd creates first gradients with detach(), which forbids that;
  // ours are replaced once.
  static void point_at(::torch::Tensor& grad, const ::torch::Tensor& memory) {
    if (grad.defined() && grad.unsafeGetTensorImpl()->allow_tensor_metadata_change()) {
      ::torch::NoGradGuard no_grad;
      grad.set_(memory);
    } else {
      grad = memory;
    }
  }

  std::vector<::torch::Tensor> params_;
  const c10::Device device_;
};

// The one device every parameter and buffer is on (CPU or CUDA): DDP
// replicates a whole module on each rank, and buckets live on its device.
c10::Device module_device(const std::vector<std::pair<std::string, ::torch::Tensor>>& params,
                          const std::vector<std::pair<std::string, ::torch::Tensor>>& buffers) {
  std::optional<std::pair<std::string, c10::Device>> first;
  const auto visit = [&](const std::string& what, const ::torch::Tensor& t) {
    buffer_of(t, what);  // a device lockstep takes
    if (!first) first.emplace(what, t.device());
    else if (t.device() != first->second)
      throw InvalidArgument(fmt::format(
          "DistributedDataParallel: {} is on {} but {} is on {}; every parameter and buffer of the module must be "
          "on one device: move the module there (module->to(device)) before wrapping it",
          what, t.device().str(), first->first, first->second.str()));
  };
  for (const auto& [name, t] : params) visit(fmt::format("parameter '{}'", name), t);
  for (const auto& [name, t] : buffers) visit(fmt::format("buffer '{}'", name), t);
  return first ? first->second : c10::Device(c10::kCPU);
}

// The options that decide which collectives a rank issues, as text.
std::vector<std::pair<std::string, std::string>> describe_options(const DDPOptions& o) {
  return {{"bucket_cap_mb", fmt::format("{}", o.bucket_cap_mb)},
          {"first_bucket_mb", fmt::format("{}", o.first_bucket_mb)},
          {"find_unused_parameters", fmt::format("{}", o.find_unused_parameters)},
          {"static_graph", fmt::format("{}", o.static_graph)},
          {"gradient_as_bucket_view", fmt::format("{}", o.gradient_as_bucket_view)},
          {"broadcast_buffers", fmt::format("{}", o.broadcast_buffers)},
          {"autotune_bucket_cap", fmt::format("{}", o.autotune_bucket_cap)},
          {"comm_hook", o.comm_hook ? o.comm_hook->name() : std::string("none")},
          {"stats_window", fmt::format("{}", o.stats_window)}};
}

// A bucket size in MB as bytes. NaN, infinities and negative sizes are
// refused: converting them to an integer is undefined, and gave any bucket
// plan at all.
std::size_t bucket_bytes(double mb, const char* option) {
  constexpr double kMostMb = 1 << 20;  // 1 TiB: far beyond any model's gradients
  if (!(std::isfinite(mb) && mb >= 0 && mb <= kMostMb))
    throw InvalidArgument(fmt::format("DistributedDataParallel: {} must be a number of MB from 0 to {}, not {}", option,
                                      kMostMb, mb));
  return static_cast<std::size_t>(mb * 1024 * 1024);
}

ReducerOptions reducer_options(const DDPOptions& o) {
  ReducerOptions r;
  r.buckets.bucket_cap_bytes = bucket_bytes(o.bucket_cap_mb, "bucket_cap_mb");
  r.buckets.first_bucket_bytes = bucket_bytes(o.first_bucket_mb, "first_bucket_mb");
  r.find_unused_parameters = o.find_unused_parameters;
  r.static_graph = o.static_graph;
  r.gradient_as_bucket_view = o.gradient_as_bucket_view;
  r.comm_hook = o.comm_hook;
  r.autotune_bucket_cap = o.autotune_bucket_cap;
  return r;
}

}  // namespace

struct DataParallelCore::State {
  std::shared_ptr<::torch::nn::Module> module;
  std::shared_ptr<ProcessGroup> pg;
  DDPOptions options;
  std::vector<std::string> names;
  std::vector<::torch::Tensor> params;
  std::vector<::torch::Tensor> buffers;
  std::unique_ptr<TorchGradients> gradients;
  std::unique_ptr<Reducer> reducer;
  // Each parameter's gradient accumulator and the key of our hook on it;
  // holding the accumulator keeps it (and so the hook) alive.
  std::vector<std::pair<libtorch::GradAccumulator, std::uintptr_t>> hooks;
  bool finalize_queued = false;
  StepTimes times;
  bool divide_by_initial_world_size = true;  // set by a Join (join_hook)
  bool forwarded = false;                    // a forward ran (register_comm_hook comes before)
  const char* hook_origin = nullptr;         // where the comm hook came from, if one was given

  // Step statistics. A step runs from one training forward to the next (or
  // to an evaluation forward, which pauses the count until training resumes).
  std::int64_t step_start_us = 0;
  std::size_t steps_closed = 0;
  StepAccumulator window;  // since the last cross-rank comparison
  StepAccumulator total;   // all steps after the first two
  StragglerDetector detector;
  std::vector<RankSummary> last_window;
  std::vector<int> stragglers;

  bool tracing() const { return pg->tracing(); }
  bool autotune_reported = false;

  // At a training forward (or its shadow under a Join): the Reducer's
  // one rebuild, and autotuning's choice said once.
  void rebuild_buckets() {
    reducer->maybe_rebuild_buckets();
    const auto& tuned = reducer->bucket_autotune();
    if (!tuned || autotune_reported) return;
    autotune_reported = true;
    constexpr double kMiB = 1 << 20;
    if (pg->rank() == 0)
      log.info("bucket autotuning chose a {:.2f} MiB cap ({} buckets): {:.2f} ms of communication predicted after "
               "backward instead of {:.2f} ms with {:.2f} MiB (backward {:.1f} ms; all-reduce in the step fitted as "
               "{} with {:.1f} us per message, {:.2f} GB/s, {:.1f}x the idle group's time)",
               static_cast<double>(tuned->bucket_cap_bytes) / kMiB, tuned->buckets, tuned->predicted_exposed_ms,
               tuned->configured_exposed_ms, static_cast<double>(tuned->configured_cap_bytes) / kMiB,
               tuned->backward_ms, tuned->algorithm, tuned->alpha_us,
               tuned->beta_us_per_byte > 0 ? 1e-3 / tuned->beta_us_per_byte : 0.0, tuned->contention);
  }

  // The end of backward: timeline events for it and its buckets.
  void trace_backward() {
    if (!tracing()) return;
    const StepStats& b = times.backward;
    pg->trace("backward", "step", b.backward_start_us, b.backward_end_us);
    pg->trace("wait for gradients", "step", b.backward_end_us, b.finalize_end_us);
    for (std::size_t i = 0; i < b.buckets.size(); ++i)
      pg->trace(fmt::format("bucket {} ({:.2f} MiB)", i, static_cast<double>(b.buckets[i].bytes) / (1 << 20)),
                "buckets", b.buckets[i].launched_us, b.buckets[i].finished_us);
  }

  // Closes the step that ends now (if one is open) and opens the next.
  void close_step(std::int64_t now) {
    if (step_start_us != 0) {
      const StepStats& b = times.backward;
      const bool synced = b.synchronised && b.backward_start_us >= step_start_us;
      double comm = 0;
      if (synced)
        for (const auto& bucket : b.buckets) comm += static_cast<double>(bucket.finished_us - bucket.started_us) / 1000.0;
      const double step_ms = static_cast<double>(now - step_start_us) / 1000.0;
      const double exposed = synced ? b.exposed_communication_ms() : 0.0;
      const double bytes = synced && pg->size() > 1 ? static_cast<double>(b.bytes()) : 0.0;
      window.add(step_ms, exposed, comm, times.data_ms, bytes);
      if (++steps_closed > 2) total.add(step_ms, exposed, comm, times.data_ms, bytes);
      if (tracing() && b.finalize_end_us >= step_start_us)
        pg->trace("between steps (optimizer, data, ...)", "step", b.finalize_end_us, now);
    }
    step_start_us = now;
    times.data_ms = 0;
  }

  // At a training forward: compares with the other ranks at the end of a
  // window. Collective: every rank closes the same training steps, whether
  // at this forward or at an evaluation forward before it.
  void maybe_compare_ranks() {
    if (options.stats_window > 0 && window.steps() >= options.stats_window) compare_ranks();
  }

  void compare_ranks() {
    const RankSummary mine = window.summary(pg->rank());
    window.clear();
    constexpr std::size_t kFields = 7;
    const double fields[kFields] = {static_cast<double>(mine.steps), mine.step_ms, mine.compute_ms, mine.exposed_ms,
                                    mine.comm_ms, mine.data_ms, mine.bytes};
    std::vector<double> all(kFields * static_cast<std::size_t>(pg->size()));
    pg->allgather(ConstBuffer{fields, kFields, DType::f64}, Buffer{all.data(), all.size(), DType::f64})->wait();
    last_window.clear();
    for (int r = 0; r < pg->size(); ++r) {
      const double* f = &all[static_cast<std::size_t>(r) * kFields];
      RankSummary s;
      s.rank = r;
      s.steps = static_cast<std::size_t>(f[0]);
      s.step_ms = f[1];
      s.compute_ms = f[2];
      s.exposed_ms = f[3];
      s.comm_ms = f[4];
      s.data_ms = f[5];
      s.bytes = f[6];
      last_window.push_back(s);
    }
    const std::vector<int> before = std::move(stragglers);
    stragglers = detector.add(last_window);
    // Said once when it starts, not every window (rank 0 speaks for all).
    if (stragglers != before && pg->rank() == 0) {
      if (!stragglers.empty())
        log.warn("straggler(s) over the last {} steps:\n{}", mine.steps, describe_stragglers(last_window, stragglers));
      else
        log.warn("no straggler any more over the last {} steps", mine.steps);
    }
  }

  void write_stats_file() const;
  nlohmann::json autotune_json() const;
  Logger log;

  // Under a Join, the rank with the largest number among those whose flag
  // is set (e.g. still training): all-reduce(max). -1 if none.
  int highest_rank_with(bool flag) const {
    std::int32_t value = flag ? pg->rank() : -1;
    pg->allreduce(Buffer{&value, 1, DType::i32}, ReduceOp::max)->wait();
    return value;
  }
  // Under a Join: whether any rank still training synchronises in this
  // backward (not under no_sync), so that joined ranks shadow it.
  bool any_rank_syncs(bool mine) const {
    std::int32_t value = mine ? 1 : 0;
    pg->allreduce(Buffer{&value, 1, DType::i32}, ReduceOp::sum)->wait();
    return value > 0;
  }

  void on_gradient(std::size_t i) {
    // The first gradient of a backward pass schedules the end-of-backward
    // step; autograd runs it once the whole graph is done.
    if (!finalize_queued) {
      finalize_queued = true;
      autograd::Engine::get_default_engine().queue_callback([this] {
        finalize_queued = false;
        reducer->finalize();
        times.backward = reducer->last_step();
        trace_backward();
      });
    }
    reducer->mark_ready(i);
  }

  // Parameters whose gradient accumulator cannot be reached from the
  // outputs: they will get no gradient this iteration.
  std::vector<std::size_t> unused_parameters(const std::vector<::torch::Tensor>& outputs) const {
    std::unordered_set<const autograd::Node*> seen;
    std::vector<autograd::Node*> stack;
    for (const auto& t : outputs) {
      if (t.defined() && t.requires_grad() && t.grad_fn() && seen.insert(t.grad_fn().get()).second)
        stack.push_back(t.grad_fn().get());
    }
    while (!stack.empty()) {
      autograd::Node* node = stack.back();
      stack.pop_back();
      for (const auto& edge : node->next_edges())
        if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
    }
    std::vector<std::size_t> unused;
    for (std::size_t i = 0; i < hooks.size(); ++i)
      if (!seen.count(hooks[i].first.get())) unused.push_back(i);
    return unused;
  }
};

DataParallelCore::DataParallelCore(std::shared_ptr<::torch::nn::Module> module, std::shared_ptr<ProcessGroup> pg,
                                   DDPOptions options)
    : state_(std::make_unique<State>()) {
  auto& s = *state_;
  s.module = std::move(module);
  s.pg = std::move(pg);
  s.options = std::move(options);
  s.log = Logger(s.pg->config().log_level).for_rank(s.pg->rank(), s.pg->size());
  if (s.options.comm_hook) s.hook_origin = "given as DDPOptions::comm_hook";
  std::vector<std::pair<std::string, ::torch::Tensor>> named_params, named_buffers;
  for (const auto& item : s.module->named_parameters(/*recurse=*/true)) named_params.emplace_back(item.key(), item.value());
  for (const auto& item : s.module->named_buffers(/*recurse=*/true)) named_buffers.emplace_back(item.key(), item.value());
  verify_same_descriptions(*s.pg, describe_options(s.options), "the DistributedDataParallel options",
                           "Every rank must pass the same DDPOptions: ranks that bucket, hook or look for unused "
                           "parameters differently issue different collectives.");
  const c10::Device device = module_device(named_params, named_buffers);
  verify_same_across_ranks(*s.pg, named_params, "parameters");
  verify_same_across_ranks(*s.pg, named_buffers, "buffers");

  // Start every replica from rank 0's state.
  std::vector<::torch::Tensor> all;
  for (const auto& [name, t] : named_params) all.push_back(t);
  for (const auto& [name, t] : named_buffers) {
    all.push_back(t);
    s.buffers.push_back(t);
  }
  broadcast_coalesced(*s.pg, all, 0);

  std::vector<ParamSpec> specs;
  for (const auto& [name, t] : named_params) {
    if (!t.requires_grad()) continue;  // frozen parameters are not reduced
    s.names.push_back(name);
    s.params.push_back(t);
    specs.push_back(ParamSpec{name, static_cast<std::size_t>(t.numel()), dtype_of(t.scalar_type()), t.sizes().vec()});
  }
  s.gradients = std::make_unique<TorchGradients>(s.params, device);
  s.reducer = std::make_unique<Reducer>(s.pg, std::move(specs), *s.gradients, reducer_options(s.options));

  for (std::size_t i = 0; i < s.params.size(); ++i) {
    auto accumulator = autograd::impl::grad_accumulator(s.params[i]);
    State* state = state_.get();
    const auto key = accumulator->add_post_hook(std::make_unique<autograd::utils::LambdaPostHook>(
        [state, i](const autograd::variable_list& outputs, const autograd::variable_list&) {
          state->on_gradient(i);
          return outputs;
        }));
    s.hooks.emplace_back(std::move(accumulator), key);
  }
}

DataParallelCore::~DataParallelCore() {
  // The module may outlive us: take our hooks off its parameters.
  for (auto& [accumulator, key] : state_->hooks) accumulator->del_post_hook(key);
  try {
    state_->write_stats_file();
  } catch (const std::exception& e) {
    state_->log.warn("could not write the step statistics: {}", e.what());
  }
}

// Autotuning's measurements and choice for the statistics file; null when
// it did not run.
nlohmann::json DataParallelCore::State::autotune_json() const {
  const auto& t = reducer->bucket_autotune();
  if (!t) return nullptr;
  return {{"chosen_cap_mb", static_cast<double>(t->bucket_cap_bytes) / (1 << 20)},
          {"configured_cap_mb", static_cast<double>(t->configured_cap_bytes) / (1 << 20)},
          {"buckets", t->buckets},
          {"predicted_exposed_ms", t->predicted_exposed_ms},
          {"configured_exposed_ms", t->configured_exposed_ms},
          {"backward_ms", t->backward_ms},
          {"algorithm", t->algorithm},
          {"alpha_us", t->alpha_us},
          {"beta_us_per_byte", t->beta_us_per_byte},
          {"contention", t->contention}};
}

// LOCKSTEP_STATS=<prefix> (Config::stats_prefix, from the group): this
// rank's statistics as <prefix>.rank<r>.json.
void DataParallelCore::State::write_stats_file() const {
  const std::string& prefix = pg->config().stats_prefix;
  if (prefix.empty()) return;
  const RankSummary s = total.steps() > 0 ? total.summary(pg->rank()) : window.summary(pg->rank());
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : reducer->buckets()) buckets.push_back({{"parameters", b.params.size()}, {"bytes", b.bytes()}});
  nlohmann::json window_json = nlohmann::json::array();
  for (const auto& w : last_window)
    window_json.push_back({{"rank", w.rank}, {"step_ms", w.step_ms}, {"compute_ms", w.compute_ms},
                           {"exposed_ms", w.exposed_ms}, {"comm_ms", w.comm_ms}, {"data_ms", w.data_ms}});
  std::size_t parameters = 0;
  for (const auto& p : params) parameters += static_cast<std::size_t>(p.numel());
  const nlohmann::json doc = {
      {"rank", pg->rank()},        {"world_size", pg->size()},  {"backend", pg->backend()},
      {"steps", s.steps},          {"step_ms", s.step_ms},      {"compute_ms", s.compute_ms},
      {"exposed_ms", s.exposed_ms}, {"comm_ms", s.comm_ms},     {"data_ms", s.data_ms},
      {"overlap", s.overlap()},    {"bytes_per_step", s.bytes}, {"parameters", parameters},
      {"bucket_cap_mb", static_cast<double>(reducer->bucket_cap_bytes()) / (1 << 20)}, {"buckets", buckets},
      {"bucket_autotune", autotune_json()}, {"compression", options.comm_hook ? options.comm_hook->name() : "none"},
      {"last_window", window_json}, {"stragglers", stragglers}};
  write_file_atomically(fmt::format("{}.rank{}.json", prefix, pg->rank()), doc.dump(1) + "\n");
}

void DataParallelCore::before_forward() {
  auto& s = *state_;
  s.forwarded = true;
  s.times.forward_start_us = now_us();
  s.reducer->check_previous_iteration();
  const bool training = ::torch::GradMode::is_enabled() && s.module->is_training();
  const bool joining = training && join_config().enable;
  if (training) {
    // Under a Join, first of all collectives: tells ranks that joined to
    // shadow this iteration (see Shadow for their side).
    if (auto ranks_training = Join::notify_join_context(*this))
      s.reducer->set_contributing_ranks(s.divide_by_initial_world_size ? 0 : *ranks_training);
    s.close_step(s.times.forward_start_us);
    s.maybe_compare_ranks();
  } else if (s.step_start_us != 0) {
    // Evaluation (maybe on some ranks only) ends the training step; the
    // pause is nobody's step time.
    s.close_step(s.times.forward_start_us);
    s.step_start_us = 0;
  }
  if (s.finalize_queued)
    throw InvalidArgument("DistributedDataParallel: forward called while the previous backward pass is still "
                          "running; finish backward() first");
  // Collective (every rank reaches its first training forward after the
  // first synchronised step at the same point); gradient views, if any, are
  // re-pointed by the Reducer.
  if (training) s.rebuild_buckets();
  // Only training forwards broadcast buffers: an evaluation forward issues
  // no collective, so evaluating on some ranks only cannot hang the group.
  // Under a Join, rank 0 may have joined: the buffers come from the highest
  // rank still training.
  if (training && s.options.broadcast_buffers && !s.buffers.empty())
    broadcast_coalesced(*s.pg, s.buffers, joining ? s.highest_rank_with(true) : 0);
  if (joining) s.any_rank_syncs(s.reducer->sync());
}

// A joined rank's DDP: per iteration of the ranks still training, the
// collectives of their training forward (before_forward) and backward, in
// the same order, leaving their averaged gradients in this rank's
// param.grad(); at the end, the last joiner's parameters and buffers.
class DataParallelCore::Shadow final : public JoinHook {
 public:
  explicit Shadow(DataParallelCore::State& s) : s_(s) {}

  void main_hook() override {
    s_.close_step(now_us());
    s_.maybe_compare_ranks();
    s_.rebuild_buckets();
    if (s_.options.broadcast_buffers && !s_.buffers.empty())
      broadcast_coalesced(*s_.pg, s_.buffers, s_.highest_rank_with(false));
    if (s_.any_rank_syncs(false)) {
      s_.reducer->set_contributing_ranks(s_.divide_by_initial_world_size ? 0 : ranks_training());
      s_.reducer->shadow_backward();
    }
  }

  void post_hook(bool is_last_joiner) override {
    const int source = s_.highest_rank_with(is_last_joiner);
    std::vector<::torch::Tensor> state;
    for (const auto& p : s_.module->parameters(/*recurse=*/true)) state.push_back(p);
    if (s_.options.broadcast_buffers) state.insert(state.end(), s_.buffers.begin(), s_.buffers.end());
    broadcast_coalesced(*s_.pg, state, source);
  }

 private:
  DataParallelCore::State& s_;
};

void DataParallelCore::register_comm_hook(std::shared_ptr<CommHook> hook) {
  auto& s = *state_;
  if (!hook) throw InvalidArgument("DistributedDataParallel::register_comm_hook: the hook is null");
  if (s.hook_origin)
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel::register_comm_hook({}): a communication hook is already registered ({}, {}); "
        "a DDP takes one hook, registered once (as in PyTorch): make a new DistributedDataParallel to change it",
        hook->name(), s.options.comm_hook->name(), s.hook_origin));
  if (s.forwarded)
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel::register_comm_hook({}): called after the first forward; register the hook "
        "before training starts (right after constructing the DistributedDataParallel), as in PyTorch",
        hook->name()));
  verify_same_descriptions(*s.pg, {{"comm_hook", hook->name()}}, "the registered communication hooks",
                           "Every rank must register the same communication hook: ranks that reduce their buckets "
                           "differently issue different collectives.");
  s.reducer->set_comm_hook(hook);
  s.options.comm_hook = std::move(hook);
  s.hook_origin = "by an earlier register_comm_hook";
}

std::unique_ptr<JoinHook> DataParallelCore::join_hook(const JoinOptions& options) {
  state_->divide_by_initial_world_size = options.divide_by_initial_world_size;
  return std::make_unique<Shadow>(*state_);
}

void DataParallelCore::after_forward(const std::vector<::torch::Tensor>& outputs) {
  auto& s = *state_;
  s.times.forward_end_us = now_us();
  if (s.tracing()) s.pg->trace("forward", "step", s.times.forward_start_us, s.times.forward_end_us);
  if (!::torch::GradMode::is_enabled() || !s.reducer->sync()) return;
  // A static graph's unused parameters are known after the first iteration.
  const bool search = s.options.find_unused_parameters && !(s.options.static_graph && s.reducer->iterations() > 0);
  s.reducer->prepare_for_backward(search ? s.unused_parameters(outputs) : std::vector<std::size_t>{});
}

Reducer& DataParallelCore::reducer() { return *state_->reducer; }
const Reducer& DataParallelCore::reducer() const { return *state_->reducer; }
ProcessGroup& DataParallelCore::group() const { return *state_->pg; }
const StepTimes& DataParallelCore::last_step() const { return state_->times; }

RankSummary DataParallelCore::summary() const {
  const auto& s = *state_;
  return s.total.steps() > 0 ? s.total.summary(s.pg->rank()) : s.window.summary(s.pg->rank());
}

const std::vector<RankSummary>& DataParallelCore::last_window() const { return state_->last_window; }
const std::vector<int>& DataParallelCore::stragglers() const { return state_->stragglers; }

void DataParallelCore::add_data_time(std::int64_t start_us, std::int64_t end_us) {
  state_->times.data_ms += static_cast<double>(end_us - start_us) / 1000.0;
  if (state_->tracing()) state_->pg->trace("data loading", "data", start_us, end_us);
}

DataTimer::DataTimer(DataParallelCore& core) : core_(core), start_us_(now_us()) {}
DataTimer::~DataTimer() { stop(); }

void DataTimer::stop() {
  if (start_us_ == 0) return;
  core_.add_data_time(start_us_, now_us());
  start_us_ = 0;
}

void DataTimer::restart() { start_us_ = now_us(); }

double DataParallelCore::bucket_cap_mb() const {
  return static_cast<double>(state_->reducer->bucket_cap_bytes()) / (1 << 20);
}

const std::optional<BucketAutotune>& DataParallelCore::bucket_autotune() const {
  return state_->reducer->bucket_autotune();
}

std::vector<std::vector<std::string>> DataParallelCore::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : state_->reducer->buckets()) {
    out.emplace_back();
    for (std::size_t i : b.params) out.back().push_back(state_->names[i]);
  }
  return out;
}

}  // namespace lockstep::torch
