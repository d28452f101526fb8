// ShardBackup; see lockstep/torch/shard_backup.h. The copy of the kept
// rank's shard is a ShardCopy (shard_copy.h); this file keeps it current:
// the shards and optimizer state sent once, then the reduced gradients
// every step.
#include "lockstep/torch/shard_backup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <utility>

#include "fsdp_unit.h"
#include "libtorch_version.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_state.h"
#include "shard_copy.h"
#include "state_digest.h"
#include "zero_pieces.h"

namespace lockstep::torch {
namespace {

using ::torch::Tensor;
using detail::FsdpUnit;
using detail::OwnShard;
using detail::ShardCopy;
using detail::ShardRange;

// Tags of the messages between neighbours: the flags, then one per unit;
// at the start, the optimizer state's table and tensors.
constexpr int kBackupFlagsTag = 0x5b00;
constexpr int kBackupFirstUnitTag = 0x5b01;
constexpr int kBackupStateTableTag = 0x5a00;
constexpr int kBackupStateTensorTag = 0x5a01;

}  // namespace

struct ShardBackup::State {
  ProcessGroup* group = nullptr;
  ::torch::optim::Optimizer* user = nullptr;
  int kept_rank = 0;
  int next_rank = 0;
  std::unique_ptr<OwnShard> own;    // this rank's, as it is sent
  std::unique_ptr<ShardCopy> copy;  // of the kept rank's shard
  std::size_t unit_count = 0;
  // The user's optimizer's parameters (groups' order) with elements in
  // this rank's shard, and their tensors: what the next rank's copy holds.
  std::vector<std::size_t> own_indices;
  std::vector<Tensor> own_params;
  // One flag per parameter of every unit: whether it has a gradient.
  std::vector<std::int32_t> flags_out;
  std::vector<std::int32_t> flags_in;

  // The gradients' exchange issued by send_gradients(), until received.
  std::vector<std::shared_ptr<Work>> in_flight;
  // Whether this step's exchange has ended (receive_gradients()): step()
  // then only steps the copy.
  bool received = false;

  void exchange_shards();
  void exchange_optimizer_state();
  void send_gradients();
  void receive_gradients();
  void exchange(std::vector<std::shared_ptr<Work>>& works, std::optional<ConstBuffer> out, std::optional<Buffer> in,
                int tag) const;
};

void ShardBackup::State::exchange(std::vector<std::shared_ptr<Work>>& works, std::optional<ConstBuffer> out,
                                  std::optional<Buffer> in, int tag) const {
  detail::ring_exchange(*group, next_rank, kept_rank, works, out, in, tag);
}

ShardBackup::ShardBackup(FullyShardModule& model, ::torch::optim::Optimizer& optimizer)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.group = &model.group();
  s.user = &optimizer;
  const int size = s.group->size();
  const int rank = s.group->rank();
  if (size < 2)
    throw InvalidArgument("ShardBackup: a group of one rank has no peer to keep a copy of its shards");
  if (!zero_pieces::steps_elementwise(optimizer))
    throw ConfigError("ShardBackup: the copy of a shard is stepped as its owner steps it, which needs exactly one of "
                      "libtorch's SGD, Adam, AdamW, Adagrad or RMSprop (not a subclass): they update each element from "
                      "its own gradient and state");
  s.kept_rank = (rank + size - 1) % size;
  s.next_rank = (rank + 1) % size;

  std::vector<FsdpUnit*> units = model.unit().units_within();
  for (FsdpUnit* unit : units) {
    if (&unit->group() != s.group)
      throw InvalidArgument(fmt::format("ShardBackup: unit {} is sharded over another group than the root's; shard "
                                        "every unit over one group",
                                        unit->name()));
    unit->keep_gradient_memory();
    // A step with this copy's shard taken over folds in shard order: the
    // clean steps must too, for its bits to be theirs (host memory, as
    // that step's collectives are).
    if (unit->shard().is_cpu()) unit->options().reduce_in_shard_order = true;
  }
  s.unit_count = units.size();
  s.own = std::make_unique<OwnShard>(units, rank);
  s.copy = std::make_unique<ShardCopy>(units, optimizer, s.kept_rank);
  detail::ParamsInShard mine = detail::params_in_shard(units, optimizer, rank);
  s.own_indices = std::move(mine.indices);
  s.own_params = std::move(mine.params);
  std::size_t params = 0;
  for (const FsdpUnit* unit : units) params += unit->params().size();
  s.flags_out.assign(params, 0);
  s.flags_in.assign(params, 0);
  // A replacement joining a running group: its peers are past their
  // backups' first exchange, and ShardedResilientTrainer feeds it its
  // shard and re-forms the ring of copies with it; this backup is never used.
  if (s.group->joined()) return;
  s.exchange_shards();
  s.exchange_optimizer_state();
}

ShardBackup::~ShardBackup() {
  // A transfer send_gradients() started writes into this object's buffers
  // until it ends.
  abandon_gradients();
}

// Every unit's shard to the next rank; the kept rank's into the copy.
void ShardBackup::State::exchange_shards() {
  std::vector<std::shared_ptr<Work>> works;
  for (std::size_t u = 0; u < unit_count; ++u) {
    std::optional<ConstBuffer> out;
    std::optional<Buffer> in;
    if (own->holds(u)) out = buffer_of(own->block(u), "a unit's shard");
    if (copy->holds(u)) in = buffer_of(copy->block(u), "the copy of a unit's shard");
    exchange(works, out, in, kBackupFirstUnitTag + static_cast<int>(u));
  }
  wait_all(works);  // every one, even after a failure: none may write into a shard later
}

// The optimizer state this rank's pieces have (a job resumed from a
// checkpoint, or a backup made after the first steps) to the next rank's
// copy: first a StateTable's entries (per piece: which state tensors it
// has, its step count), then the tensors, each into one made for it
// beside the piece.
void ShardBackup::State::exchange_optimizer_state() {
  const StateTable mine = state_table(*user, own_params);
  detail::ring_exchange_optimizer_state(*group, next_rank, kept_rank, &mine, copy.get(), kBackupStateTableTag,
                                        kBackupStateTensorTag);
}

// This rank's gradients (the ones its optimizer steps with) to the next
// rank, with a flag per parameter saying which have one; the kept rank's
// into the copy's gradient buffers (receive_gradients waits for them).
void ShardBackup::State::send_gradients() {
  ::torch::NoGradGuard no_grad;
  own->flags(flags_out);
  exchange(in_flight, ConstBuffer{flags_out.data(), flags_out.size(), DType::i32},
           Buffer{flags_in.data(), flags_in.size(), DType::i32}, kBackupFlagsTag);
  for (std::size_t u = 0; u < unit_count; ++u) {
    std::optional<ConstBuffer> out;
    std::optional<Buffer> in;
    if (copy->holds(u)) in = buffer_of(copy->gradient_block(u), "the kept rank's gradients");
    if (own->holds(u)) out = buffer_of(own->gradients(u), "a unit's reduced gradients");
    exchange(in_flight, out, in, kBackupFirstUnitTag + static_cast<int>(u));
  }
}

void ShardBackup::State::receive_gradients() {
  // Every one waited for, even after a failure: none may write into a buffer later.
  const std::vector<std::shared_ptr<Work>> transfers = std::move(in_flight);
  in_flight.clear();
  wait_all(transfers);
  copy->use_received_gradients(flags_in);
  received = true;
}

void ShardBackup::send_gradients() {
  State& s = *state_;
  if (s.in_flight.empty() && !s.received) s.send_gradients();
}

void ShardBackup::receive_gradients() {
  State& s = *state_;
  if (s.received) return;
  if (s.in_flight.empty()) s.send_gradients();
  s.receive_gradients();
}

void ShardBackup::step() {
  receive_gradients();
  State& s = *state_;
  s.received = false;
  s.copy->step(*s.user);
}

void ShardBackup::abandon_gradients() {
  State& s = *state_;
  for (const auto& work : s.in_flight) {
    try {
      work->wait();
    } catch (const std::exception&) {
      // The failure the caller already saw, or another of the same group.
    }
  }
  s.in_flight.clear();
  s.received = false;
}

void ShardBackup::verify() {
  State& s = *state_;
  zero_pieces::copy_options(s.user->param_groups(), s.copy->optimizer().param_groups());
  // Parameters' bytes, then the optimizer's learning rates and state: this
  // rank's own, and its copy of the kept rank's.
  std::uint64_t digests[2] = {digest_of(s.own_params, kDigestStart), 0};
  digests[0] = digest_of(*s.user, digests[0], &s.own_indices);
  // The copy's parameters in its groups' order, which is the user's
  // groups' order of the kept rank's own parameters.
  digests[1] = digest_of(s.copy->optimizer(), digest_of(params_of(s.copy->optimizer()), kDigestStart));
  const auto size = static_cast<std::size_t>(s.group->size());
  std::vector<std::uint64_t> all(2 * size);
  static_assert(sizeof(std::uint64_t) == sizeof(std::int64_t));
  s.group->allgather(ConstBuffer{digests, 2, DType::i64}, Buffer{all.data(), all.size(), DType::i64})->wait();
  std::vector<int> differ;
  for (std::size_t r = 0; r < size; ++r)
    if (all[2 * r + 1] != all[2 * ((r + size - 1) % size)]) differ.push_back(static_cast<int>(r));
  if (!differ.empty())
    throw Error(fmt::format("ShardBackup: the copies kept by rank(s) {} differ from their predecessors' shards "
                            "(parameters or optimizer state): a rank rebuilt from such a copy would train apart "
                            "silently",
                            fmt::join(differ, ",")));
}

int ShardBackup::kept_rank() const { return state_->kept_rank; }

std::size_t ShardBackup::bytes() const {
  return state_->copy->bytes() + state_->own->bytes();
}

std::vector<Tensor> ShardBackup::pieces() const { return state_->copy->pieces(); }

::torch::optim::Optimizer& ShardBackup::optimizer() { return state_->copy->optimizer(); }

std::vector<Tensor> ShardBackup::kept_blocks() const { return state_->copy->blocks(); }

detail::ShardCopy& ShardBackup::kept_copy() { return *state_->copy; }

void ShardBackup::step_kept(const std::vector<Tensor>& gradients) {
  State& s = *state_;
  s.copy->use_reduced_gradients(gradients, "ShardBackup::step_kept");
  s.copy->step(*s.user);
}

}  // namespace lockstep::torch
