// ZeroRedundancyOptimizer: the partition of the parameters, the sharded
// step with its all-gather, and the consolidation of the shards' optimizer
// states on one rank. Thread-safety: one thread, like a torch optimizer.
#include "lockstep/torch/zero.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <utility>

#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "libtorch_version.h"

namespace lockstep::torch {
namespace {

using ::torch::Tensor;

// Largest first, each to the rank with the fewest elements so far (the
// lowest such rank on ties), counting what earlier groups gave each rank
// (`load`, updated): a pure function of the sizes, so every rank computes
// the same owners, and a group added later leaves the earlier ones where
// they are.
std::vector<int> partition(const std::vector<Tensor>& params, std::vector<std::int64_t>& load) {
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int> owners(params.size(), 0);
  for (const auto i : order) {
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    owners[i] = static_cast<int>(lightest);
    load[static_cast<std::size_t>(lightest)] += params[i].numel();
  }
  return owners;
}

// Said when the all-gather failed outside a Join: the likeliest cause.
constexpr const char* kNotInTheJoin =
    "ZeroRedundancyOptimizer::step: the shards' all-gather did not pair with the other ranks' collectives. If a "
    "rank ran out of inputs under a Join, this optimizer must be in the Join too: Join({ddp, zero})";

// Moves each state entry of `params` from `from` into `to` (a copy).
void copy_state(::torch::optim::Optimizer& from, ::torch::optim::Optimizer& to, const std::vector<Tensor>& params) {
  for (const auto& p : params) {
    const auto it = from.state().find(libtorch::optimizer_state_key(p));
    if (it != from.state().end()) to.state()[libtorch::optimizer_state_key(p)] = it->second->clone();
  }
}

// Each group's options of `from`, into the same group of `to`.
void copy_options(const std::vector<::torch::optim::OptimizerParamGroup>& from,
                  std::vector<::torch::optim::OptimizerParamGroup>& to) {
  for (std::size_t g = 0; g < from.size() && g < to.size(); ++g) to[g].set_options(from[g].options().clone());
}

// The parameters of a list of groups, refused if there are none or one is
// undefined; then the defaults of the optimizer the factory makes.
std::unique_ptr<::torch::optim::OptimizerOptions> checked_defaults(
    const std::vector<::torch::optim::OptimizerParamGroup>& groups,
    const ZeroRedundancyOptimizer::OptimizerFactory& make_optimizer) {
  std::vector<Tensor> all;
  for (const auto& g : groups) all.insert(all.end(), g.params().begin(), g.params().end());
  if (all.empty()) throw InvalidArgument("ZeroRedundancyOptimizer got an empty parameter list");
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!all[i].defined()) throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer: parameter {} is undefined", i));
  if (!make_optimizer) throw InvalidArgument("ZeroRedundancyOptimizer needs a way to build the optimizer");
  return make_optimizer(std::move(all))->defaults().clone();
}

std::string serialized(::torch::optim::Optimizer& optimizer) {
  ::torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                                                 OptimizerFactory make_optimizer)
    : ZeroRedundancyOptimizer(std::vector<ParamGroup>{ParamGroup(std::move(parameters))}, std::move(group),
                              std::move(make_optimizer)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<ParamGroup> param_groups,
                                                 std::shared_ptr<ProcessGroup> group, OptimizerFactory make_optimizer)
    : Optimizer(param_groups, checked_defaults(param_groups, make_optimizer)),
      group_(std::move(group)),
      make_optimizer_(std::move(make_optimizer)) {
  if (!group_) throw InvalidArgument("ZeroRedundancyOptimizer needs a process group (lockstep::init_process_group())");
  load_.assign(static_cast<std::size_t>(group_->size()), 0);
  sync_groups();
}

// Takes in the groups added since the last call (all of them at
// construction): checks their parameters, shares them out, and gives this
// rank's part of each to its optimizer (made once it has a parameter).
void ZeroRedundancyOptimizer::sync_groups() {
  if (groups_seen_ == param_groups_.size()) return;
  for (std::size_t g = groups_seen_; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (const auto& p : params) {
      const std::size_t i = parameters_.size();
      if (!p.defined()) throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer: parameter {} is undefined", i));
      dtype_of(p.scalar_type());  // throws for types lockstep cannot all-gather
      // The shards are packed into one tensor per dtype and all-gathered
      // there: every parameter on one device (the CPU or one GPU).
      const Tensor& first = parameters_.empty() ? p : parameters_[0];
      if (p.device() != first.device())
        throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer: parameter 0 is on {} but parameter {} is on {}; "
                                          "the parameters must all be on one device (move the model with "
                                          "module->to(device) before building the optimizer)",
                                          c10::str(first.device()), i, c10::str(p.device())));
      if (parameters_.empty()) buffer_of(p, "a parameter of ZeroRedundancyOptimizer");  // a device lockstep uses
      parameters_.push_back(p);
      group_of_.push_back(g);
    }
    for (const int owner : partition(params, load_)) owners_.push_back(owner);
    if (local_) local_->add_param_group(ParamGroup(shard_of(group_->rank(), g), param_groups_[g].options().clone()));
  }
  groups_seen_ = param_groups_.size();
  if (!local_ && !shard_of(group_->rank()).empty()) local_ = optimizer_over(group_->rank());
}

void ZeroRedundancyOptimizer::add_param_group(const ParamGroup& param_group) {
  Optimizer::add_param_group(param_group);
  sync_groups();
}

int ZeroRedundancyOptimizer::owner(std::size_t index) {
  sync_groups();
  return owners_.at(index);
}

// The factory's optimizer over `rank`'s shard (every parameter for -1),
// with one group per group of this optimizer, each with its options.
std::unique_ptr<::torch::optim::Optimizer> ZeroRedundancyOptimizer::optimizer_over(int rank) const {
  const auto params_of = [&](std::size_t g) {
    if (rank >= 0) return shard_of(rank, g);
    return param_groups_[g].params();
  };
  auto optimizer = make_optimizer_(params_of(0));
  optimizer->param_groups()[0].set_options(param_groups_[0].options().clone());
  for (std::size_t g = 1; g < param_groups_.size(); ++g)
    optimizer->add_param_group(ParamGroup(params_of(g), param_groups_[g].options().clone()));
  return optimizer;
}

std::vector<Tensor> ZeroRedundancyOptimizer::shard_of(int rank) const {
  std::vector<Tensor> shard;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (owners_[i] == rank) shard.push_back(parameters_[i]);
  return shard;
}

std::vector<Tensor> ZeroRedundancyOptimizer::shard_of(int rank, std::size_t group) const {
  std::vector<Tensor> shard;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (owners_[i] == rank && group_of_[i] == group) shard.push_back(parameters_[i]);
  return shard;
}

// Per dtype: every rank packs its shard into a block of the largest
// shard's size (padding the rest), one allgather brings all blocks, and each
// rank copies the other ranks' blocks into their parameters. On a GPU the
// packing, the allgather and the copies out are ordered by the current
// stream (the allgather runs after the packing queued there; wait() makes
// the stream wait for it): the host never waits for the device.
Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  // Under a Join whose first joinable this is (no DDP in it): tells joined
  // ranks to shadow this step.
  Join::notify_join_context(*this);
  Tensor loss;
  if (closure) {
    ::torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_shard_and_gather();
  return loss;
}

// What a joined rank does in each step of the ranks still training: the
// same, on the gradients that DDP's join hook (shadowed just before) left
// in param.grad(), so its shard moves as it would without Join.
class ZeroRedundancyOptimizer::JoinedStep final : public JoinHook {
 public:
  explicit JoinedStep(ZeroRedundancyOptimizer& zero) : zero_(zero) {}
  void main_hook() override { zero_.step_shard_and_gather(); }

 private:
  ZeroRedundancyOptimizer& zero_;
};

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook(const JoinOptions&) {
  return std::make_unique<JoinedStep>(*this);
}

void ZeroRedundancyOptimizer::step_shard_and_gather() {
  sync_groups();
  if (local_) {
    // A scheduler (or the user) changes the options of param_groups().
    copy_options(param_groups_, local_->param_groups());
    local_->step();
  }
  const int ranks = group_->size(), me = group_->rank();
  if (ranks == 1) return;
  ::torch::NoGradGuard no_grad;
  std::map<::torch::ScalarType, std::vector<std::size_t>> by_type;  // ordered: the same on every rank
  for (std::size_t i = 0; i < parameters_.size(); ++i) by_type[parameters_[i].scalar_type()].push_back(i);
  for (const auto& [type, indices] : by_type) {
    std::vector<std::int64_t> elements(static_cast<std::size_t>(ranks), 0);
    for (const auto i : indices) elements[static_cast<std::size_t>(owners_[i])] += parameters_[i].numel();
    const std::int64_t block = *std::max_element(elements.begin(), elements.end());
    if (block == 0) continue;
    Tensor packed = ::torch::zeros({block}, parameters_[indices[0]].options().requires_grad(false));
    std::int64_t offset = 0;
    for (const auto i : indices) {
      if (owners_[i] != me) continue;
      packed.slice(0, offset, offset + parameters_[i].numel()).copy_(parameters_[i].detach().reshape({-1}));
      offset += parameters_[i].numel();
    }
    Tensor all = ::torch::empty({block * ranks}, packed.options());
    try {
      group_->allgather(buffer_of(packed, "a parameter of ZeroRedundancyOptimizer"),
                        buffer_of(all, "a parameter of ZeroRedundancyOptimizer"))
          ->wait();
    } catch (const TimeoutError& e) {
      if (join_config().enable) throw;
      throw TimeoutError(fmt::format("{}\n{}", e.what(), kNotInTheJoin), e.peer());
    } catch (const MismatchError& e) {
      if (join_config().enable) throw;
      throw MismatchError(fmt::format("{}\n{}", e.what(), kNotInTheJoin));
    }
    std::vector<std::int64_t> cursor(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) cursor[static_cast<std::size_t>(r)] = r * block;
    for (const auto i : indices) {
      auto& at = cursor[static_cast<std::size_t>(owners_[i])];
      if (owners_[i] != me) parameters_[i].detach().copy_(all.slice(0, at, at + parameters_[i].numel()).view_as(parameters_[i]));
      at += parameters_[i].numel();
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  sync_groups();
  for (auto& p : parameters_) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.mutable_grad().reset();
    } else {
      p.mutable_grad().detach_();
      p.mutable_grad().zero_();
    }
  }
}

// Every other rank sends its optimizer's serialized state (its size first,
// then the bytes) to `to`, which loads each into an optimizer over that
// rank's shard and copies the per-parameter state into one optimizer over
// all parameters.
void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int ranks = group_->size(), me = group_->rank();
  if (to < 0 || to >= ranks)
    throw InvalidArgument(fmt::format("consolidate_state_dict: rank {} is not in the group of {} rank(s)", to, ranks));
  sync_groups();
  consolidated_.reset();
  if (me != to) {
    const std::string bytes = local_ ? serialized(*local_) : std::string();
    std::int64_t size = static_cast<std::int64_t>(bytes.size());
    group_->send(ConstBuffer{&size, 1, DType::i64}, to)->wait();
    if (size > 0) group_->send(ConstBuffer{bytes.data(), bytes.size(), DType::u8}, to)->wait();
    return;
  }
  auto full = optimizer_over(-1);
  if (local_) copy_state(*local_, *full, shard_of(me));
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;
    std::int64_t size = 0;
    group_->recv(Buffer{&size, 1, DType::i64}, r)->wait();
    if (size == 0) continue;
    std::string bytes(static_cast<std::size_t>(size), '\0');
    group_->recv(Buffer{bytes.data(), bytes.size(), DType::u8}, r)->wait();
    auto theirs = optimizer_over(r);
    ::torch::serialize::InputArchive archive;
    // Onto this rank's device: rank r saved the tensors of its own (another
    // GPU of this host, perhaps).
    archive.load_from(bytes.data(), bytes.size(), parameters_[0].device());
    theirs->load(archive);
    copy_state(*theirs, *full, shard_of(r));
  }
  consolidated_ = std::move(full);
}

::torch::optim::Optimizer& ZeroRedundancyOptimizer::consolidated() {
  return const_cast<::torch::optim::Optimizer&>(std::as_const(*this).consolidated());
}

const ::torch::optim::Optimizer& ZeroRedundancyOptimizer::consolidated() const {
  if (!consolidated_)
    throw InvalidArgument(fmt::format(
        "ZeroRedundancyOptimizer: rank {} holds no consolidated state; call consolidate_state_dict(to) on every rank "
        "first, and read it on rank `to` only",
        group_->rank()));
  return *consolidated_;
}

void ZeroRedundancyOptimizer::save(::torch::serialize::OutputArchive& archive) const {
  consolidated().save(archive);
}

void ZeroRedundancyOptimizer::load(::torch::serialize::InputArchive& archive) {
  sync_groups();
  auto full = optimizer_over(-1);
  full->load(archive);
  copy_options(full->param_groups(), param_groups_);
  if (local_) {
    copy_state(*full, *local_, shard_of(group_->rank()));
    copy_options(param_groups_, local_->param_groups());
  }
}

std::size_t optimizer_state_bytes(const ::torch::optim::Optimizer& optimizer) {
  std::size_t bytes = 0;
  const auto add = [&](const Tensor& t) {
    if (t.defined()) bytes += static_cast<std::size_t>(t.numel()) * t.element_size();
  };
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* s = dynamic_cast<const ::torch::optim::SGDParamState*>(state.get())) {
      add(s->momentum_buffer());
    } else if (auto* s = dynamic_cast<const ::torch::optim::AdamParamState*>(state.get())) {
      add(s->exp_avg()), add(s->exp_avg_sq()), add(s->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<const ::torch::optim::AdamWParamState*>(state.get())) {
      add(s->exp_avg()), add(s->exp_avg_sq()), add(s->max_exp_avg_sq());
    } else if (auto* s = dynamic_cast<const ::torch::optim::AdagradParamState*>(state.get())) {
      add(s->sum());
    } else if (auto* s = dynamic_cast<const ::torch::optim::RMSpropParamState*>(state.get())) {
      add(s->square_avg()), add(s->momentum_buffer()), add(s->grad_avg());
    }
  }
  return bytes;
}

}  // namespace lockstep::torch
