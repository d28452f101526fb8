// Join: uneven inputs across ranks; see lockstep/torch/join.h for the
// protocol. The counting all-reduces are sums of small integers carried as
// fp32 (exact), which every backend reduces.
#include "lockstep/torch/join.h"

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "common/log.h"

namespace lockstep::torch {

Join::Join(std::vector<std::reference_wrapper<Joinable>> joinables, bool enable, bool throw_on_early_termination)
    : Join(std::move(joinables), JoinOptions{enable, throw_on_early_termination}) {}

Join::Join(std::vector<std::reference_wrapper<Joinable>> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options), uncaught_at_start_(std::uncaught_exceptions()) {
  if (joinables_.empty())
    throw InvalidArgument("Join needs at least one joinable (e.g. the DistributedDataParallel whose inputs are "
                          "uneven): Join join({ddp});");
  group_ = &joinables_.front().get().join_process_group();
  for (std::size_t i = 0; i < joinables_.size(); ++i) {
    Joinable& j = joinables_[i].get();
    if (j.active_join_)
      throw InvalidArgument(fmt::format("Join: joinable {} is already inside another active Join; finish that one "
                                        "(join()) first, Joins do not nest",
                                        i));
    for (std::size_t k = 0; k < i; ++k)
      if (&joinables_[k].get() == &j)
        throw InvalidArgument(fmt::format("Join: joinables {} and {} are the same object; list each once", k, i));
    if (&j.join_process_group() != group_)
      throw InvalidArgument(fmt::format("Join: joinable {} runs its collectives on another process group than "
                                        "joinable 0; every joinable of a Join must use the same group",
                                        i));
  }
  // Shadowed in the order of a training iteration: forward and backward
  // (DDP) before the optimizer's step; the first one notifies.
  std::stable_partition(joinables_.begin(), joinables_.end(),
                        [](const std::reference_wrapper<Joinable>& j) { return !j.get().joins_at_step(); });
  for (auto& j : joinables_) hooks_.push_back(j.get().join_hook(options_));
  for (std::size_t i = 0; i < joinables_.size(); ++i) {
    Joinable& j = joinables_[i].get();
    j.join_config_ = JoinConfig{options_.enable, options_.throw_on_early_termination, i == 0};
    j.active_join_ = this;
  }
}

Join::~Join() {
  if (!joined_ && options_.enable && std::uncaught_exceptions() == uncaught_at_start_) {
    try {
      join();
    } catch (const std::exception& e) {
      Logger(group_->config().log_level).for_rank(group_->rank(), group_->size()).error("Join: joining at the end of its scope failed: {}", e.what());
    }
  }
  // Leaving by an exception: no collectives (the other ranks may be gone).
  release();
}

void Join::release() {
  for (auto& j : joinables_) {
    if (j.get().active_join_ != this) continue;
    j.get().join_config_ = JoinConfig{};
    j.get().active_join_ = nullptr;
  }
}

int Join::all_reduce_count(int mine) const {
  float value = static_cast<float>(mine);
  group_->allreduce(Buffer{&value, 1, DType::f32}, ReduceOp::sum)->wait();
  return static_cast<int>(value + 0.5f);
}

// A joined rank's counting all-reduce. Timing out here means the ranks
// still training are waiting elsewhere: most likely in a collective that
// no joinable of this Join shadows.
int Join::count_while_joined() const {
  const auto hint = [&] {
    return fmt::format("Join: rank {} ran out of inputs and waited for the ranks still training, which did not come "
                       "back to the Join's all-reduce: they are probably in a collective that no joinable of this "
                       "Join shadows, e.g. a ZeroRedundancyOptimizer's step (list it too: Join({{ddp, zero}})) or a "
                       "collective of your own",
                       group_->rank());
  };
  try {
    return all_reduce_count(0);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("{}\n{}", e.what(), hint()), e.peer());
  } catch (const MismatchError& e) {
    throw MismatchError(fmt::format("{}\n{}", e.what(), hint()));
  }
}

void Join::join() {
  if (joined_) return;
  joined_ = true;
  if (!options_.enable) {
    release();
    return;
  }
  // Pairs with the notify_join_context() all-reduce of the ranks still
  // training: the sum counts them.
  int training = count_while_joined();
  bool is_last_joiner = true;
  while (training > 0) {
    if (options_.throw_on_early_termination) {
      all_reduce_count(1);  // pairs with their second all-reduce: tells them to stop
      release();
      throw EarlyTerminationError(fmt::format(
          "rank {}/{} exhausted its inputs while {} rank(s) still had some (Join with "
          "throw_on_early_termination); give every rank the same number of batches (DistributedSampler pads or "
          "drops the last batch), or join without throw_on_early_termination to let the others finish",
          group_->rank(), group_->size(), training));
    }
    for (auto& hook : hooks_) {
      hook->ranks_training_ = training;
      hook->main_hook();
    }
    is_last_joiner = false;
    training = count_while_joined();
  }
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
  release();
}

std::optional<int> Join::notify_join_context(Joinable& joinable) {
  const JoinConfig& config = joinable.join_config_;
  if (!config.enable || !config.is_first_joinable) return std::nullopt;
  const Join& join = *joinable.active_join_;
  const int training = join.all_reduce_count(1);
  if (config.throw_on_early_termination && join.all_reduce_count(0) > 0)
    throw EarlyTerminationError(fmt::format(
        "rank {}/{}: another rank exhausted its inputs (Join with throw_on_early_termination), so every rank "
        "stops here; give every rank the same number of batches (DistributedSampler pads or drops the last "
        "batch), or join without throw_on_early_termination to let the others finish",
        join.group_->rank(), join.group_->size()));
  return training;
}

}  // namespace lockstep::torch
