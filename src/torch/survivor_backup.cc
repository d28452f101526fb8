// SurvivorBackup; see survivor_backup.h. The transfers go slot by slot:
// in slot k each rank sends the k-th shard it holds and receives its
// predecessor's k-th, as ShardBackup's exchange of one shard goes (a side
// left out where a rank holds fewer, on its peer too: every rank knows the
// holder map), so that the ring unwinds as it does there.
#include "survivor_backup.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "comm/shard_map.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_state.h"

namespace lockstep::torch::detail {

using ::torch::Tensor;

namespace {

// Tags of the messages between neighbours, apart from ShardBackup's.
constexpr int kFlagsTag = 0x5c00;
constexpr int kFirstUnitTag = 0x5c01;
constexpr int kStateTableTag = 0x5d00;
constexpr int kStateTensorTag = 0x5d01;

}  // namespace

std::optional<ConstBuffer> SurvivorBackup::Outgoing::block(std::size_t u) const {
  if (own) return own->holds(u) ? std::optional<ConstBuffer>(buffer_of(own->block(u), "a unit's shard")) : std::nullopt;
  return held->holds(u) ? std::optional<ConstBuffer>(buffer_of(held->block(u), "a held shard of a unit"))
                        : std::nullopt;
}

std::optional<ConstBuffer> SurvivorBackup::Outgoing::gradients(std::size_t u) const {
  if (own)
    return own->holds(u) ? std::optional<ConstBuffer>(buffer_of(own->gradients(u), "a unit's reduced gradients"))
                         : std::nullopt;
  return held->holds(u) ? std::optional<ConstBuffer>(buffer_of(held->gradient_block(u), "a held shard's gradients"))
                        : std::nullopt;
}

void SurvivorBackup::Outgoing::flags(std::vector<std::int32_t>& out) const {
  if (own)
    own->flags(out);
  else
    held->flags(out);
}

SurvivorBackup::SurvivorBackup(ProcessGroup& group, const std::vector<int>& holder,
                               const std::vector<FsdpUnit*>& units, ::torch::optim::Optimizer& user, int own_shard,
                               OwnShard& own, const std::vector<Tensor>& own_params,
                               const std::map<int, ShardCopy*>& held)
    : group_(&group), unit_count_(units.size()) {
  const int size = group.size();
  next_ = (group.rank() + 1) % size;
  prev_ = (group.rank() + size - 1) % size;
  for (std::size_t count : shards_per_rank(holder, size)) slots_ = std::max(slots_, count);
  for (int shard : shards_held(holder, group.rank())) {
    if (shard == own_shard) {
      outgoing_.push_back({shard, &own, nullptr});
    } else {
      const auto it = held.find(shard);
      if (it == held.end())
        throw Error(fmt::format("SurvivorBackup: shard {} is held here by the map, but this rank has no copy of it",
                                shard));
      outgoing_.push_back({shard, nullptr, it->second});
    }
  }
  for (int shard : shards_held(holder, prev_)) kept_.push_back(std::make_unique<ShardCopy>(units, user, shard));
  flags_out_.resize(slots_);
  flags_in_.resize(slots_);
  std::size_t params = 0;
  for (const FsdpUnit* unit : units) params += unit->params().size();
  for (auto& flags : flags_in_) flags.assign(params, 0);
  exchange_blocks();
  exchange_optimizer_state(user, own_params);
}

SurvivorBackup::~SurvivorBackup() {
  // A transfer in flight writes into the copies until it ends.
  abandon();
}

void SurvivorBackup::exchange_blocks() {
  std::vector<std::shared_ptr<Work>> works;
  for (std::size_t k = 0; k < slots_; ++k)
    for (std::size_t u = 0; u < unit_count_; ++u) {
      const std::optional<ConstBuffer> out = k < outgoing_.size() ? outgoing_[k].block(u) : std::nullopt;
      std::optional<Buffer> in;
      if (k < kept_.size() && kept_[k]->holds(u)) in = buffer_of(kept_[k]->block(u), "the copy of a unit's shard");
      ring_exchange(*group_, next_, prev_, works, out, in, kFirstUnitTag + static_cast<int>(u));
    }
  wait_all(works);  // every one, even after a failure: none may write into a copy later
}

// Per slot, as ShardBackup sends its own: a table of which state tensors
// each piece has and its step count, then the tensors.
void SurvivorBackup::exchange_optimizer_state(::torch::optim::Optimizer& user, const std::vector<Tensor>& own_params) {
  for (std::size_t k = 0; k < slots_; ++k) {
    std::optional<StateTable> mine;
    if (k < outgoing_.size()) {
      const Outgoing& o = outgoing_[k];
      mine = o.own ? state_table(user, own_params) : state_table(o.held->optimizer(), params_of(o.held->optimizer()));
    }
    ring_exchange_optimizer_state(*group_, next_, prev_, mine ? &*mine : nullptr,
                                  k < kept_.size() ? kept_[k].get() : nullptr, kStateTableTag, kStateTensorTag);
  }
}

void SurvivorBackup::exchange_gradients() {
  ::torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < slots_; ++k) {
    std::optional<ConstBuffer> flags_out;
    std::optional<Buffer> flags_in;
    if (k < outgoing_.size()) {
      outgoing_[k].flags(flags_out_[k]);
      flags_out = ConstBuffer{flags_out_[k].data(), flags_out_[k].size(), DType::i32};
    }
    if (k < kept_.size()) flags_in = Buffer{flags_in_[k].data(), flags_in_[k].size(), DType::i32};
    ring_exchange(*group_, next_, prev_, in_flight_, flags_out, flags_in, kFlagsTag);
    for (std::size_t u = 0; u < unit_count_; ++u) {
      const std::optional<ConstBuffer> out = k < outgoing_.size() ? outgoing_[k].gradients(u) : std::nullopt;
      std::optional<Buffer> in;
      if (k < kept_.size() && kept_[k]->holds(u))
        in = buffer_of(kept_[k]->gradient_block(u), "the predecessor's gradients");
      ring_exchange(*group_, next_, prev_, in_flight_, out, in, kFirstUnitTag + static_cast<int>(u));
    }
  }
  // Every one waited for, even after a failure: none may write into a buffer later.
  const std::vector<std::shared_ptr<Work>> transfers = std::move(in_flight_);
  in_flight_.clear();
  wait_all(transfers);
  for (std::size_t k = 0; k < kept_.size(); ++k) kept_[k]->use_received_gradients(flags_in_[k]);
}

void SurvivorBackup::abandon() {
  for (const auto& work : in_flight_) {
    try {
      work->wait();
    } catch (const std::exception&) {
      // The failure the caller already saw, or another of the same group.
    }
  }
  in_flight_.clear();
}

void SurvivorBackup::step(const ::torch::optim::Optimizer& user) {
  for (auto& copy : kept_) copy->step(user);
}

std::vector<std::unique_ptr<ShardCopy>> SurvivorBackup::take_copies() { return std::move(kept_); }

}  // namespace lockstep::torch::detail
