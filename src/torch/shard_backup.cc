// ShardBackup; see lockstep/torch/shard_backup.h. Each unit's copy is one
// flat tensor laid out as the kept rank's shard (the same offsets, so each
// piece sits where its owner's does and the two steps see the same
// alignment), with a flat gradient buffer beside it; the copy's optimizer
// steps views of it, in groups that mirror the user's.
#include "lockstep/torch/shard_backup.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <typeinfo>
#include <utility>

#include "fsdp_unit.h"
#include "fused_adam.h"
#include "libtorch_version.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_state.h"
#include "state_digest.h"
#include "zero_pieces.h"

namespace lockstep::torch {
namespace {

using ::torch::Tensor;
using detail::FsdpUnit;

// Tags of the messages between neighbours: the flags, then one per unit;
// at the start, the optimizer state's table and tensors.
constexpr int kBackupFlagsTag = 0x5b00;
constexpr int kBackupFirstUnitTag = 0x5b01;
constexpr int kBackupStateTableTag = 0x5a00;
constexpr int kBackupStateTensorTag = 0x5a01;

// A parameter's piece in a unit's shard: parameter `param` of the unit, elements
// [offset, offset + count) of the shard.
struct ShardRange {
  std::size_t param = 0;
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

struct UnitCopy {
  FsdpUnit* unit = nullptr;
  std::vector<ShardRange> own;     // this rank's pieces with elements
  std::vector<ShardRange> kept;    // the kept rank's pieces with elements
  Tensor shard;               // the copy of the kept rank's shard
  Tensor gradients;           // the kept rank's gradients, received each step
  Tensor outgoing;            // this rank's gradients, where they are not laid out as the shard already
  std::vector<Tensor> pieces;  // views of `shard`, one per kept piece
};

std::vector<ShardRange> pieces_with_elements(const FsdpUnit& unit, int rank) {
  std::vector<ShardRange> out;
  for (std::size_t i = 0; i < unit.params().size(); ++i) {
    const auto piece = unit.layout().piece_of(rank, i);
    if (piece.count > 0) out.push_back({i, piece.shard_offset, piece.count});
  }
  return out;
}

// The reduced shard this rank's gradients of the unit are views of, each
// at its piece's place, or null: what fully_shard leaves them (and
// accumulates into in place), sent then as it is, with no copy.
const Tensor* gradients_laid_as_shard(const UnitCopy& copy) {
  const Tensor& memory = copy.unit->gradient_memory();
  if (copy.own.empty() || !memory.defined() || !memory.is_cpu() ||
      memory.numel() != copy.unit->layout().shard_elements() || memory.scalar_type() != copy.unit->dtype())
    return nullptr;
  for (const ShardRange& piece : copy.own) {
    const Tensor& grad = copy.unit->params()[piece.param].grad();
    if (!grad.defined() || !grad.is_contiguous() || grad.numel() != piece.count ||
        grad.scalar_type() != memory.scalar_type() ||
        grad.data_ptr() != static_cast<const char*>(memory.data_ptr()) + piece.offset * memory.element_size())
      return nullptr;
  }
  return &memory;
}

}  // namespace

struct ShardBackup::State {
  ProcessGroup* group = nullptr;
  ::torch::optim::Optimizer* user = nullptr;
  int kept_rank = 0;
  int next_rank = 0;
  std::vector<UnitCopy> units;
  std::unique_ptr<::torch::optim::Optimizer> copy;
  // The user's optimizer's parameters (groups' order) with elements in
  // this rank's shard, and their tensors: what the next rank's copy holds.
  std::vector<std::size_t> own_indices;
  std::vector<Tensor> own_params;
  // One flag per parameter of every unit: whether it has a gradient.
  std::vector<std::int32_t> flags_out;
  std::vector<std::int32_t> flags_in;

  // The gradients' exchange issued by send_gradients(), until step().
  std::vector<std::shared_ptr<Work>> in_flight;
  // Whether the copy may be stepped in one pass over its memory (an Adam
  // whose fused step gives libtorch's bits here): the copy's step is a
  // whole shard's more on ranks whose cores are busy, and libtorch's takes
  // eight passes.
  bool fused_adam = false;

  void exchange_shards();
  void exchange_optimizer_state();
  void send_gradients();
  void receive_gradients();
  void step_copy();
  void exchange(std::vector<std::shared_ptr<Work>>& works, std::optional<ConstBuffer> out, std::optional<Buffer> in,
                int tag) const;
};

// `out` to the next rank, `in` from the kept rank. A group runs its
// operations one at a time in the order they were issued, and a large
// send waits for its receiver: were every rank to send first, none would
// ever receive. Even ranks send first, odd ranks receive first (in a ring
// of odd size rank 0 and the last rank are both even: rank 0's send to
// rank 1 goes first, and the ring unwinds from there). A side left out
// (a unit of which the rank holds no element) is left out on its peer too.
void ShardBackup::State::exchange(std::vector<std::shared_ptr<Work>>& works, std::optional<ConstBuffer> out,
                                  std::optional<Buffer> in, int tag) const {
  const auto send = [&] {
    if (out) works.push_back(group->send(*out, next_rank, tag));
  };
  const auto receive = [&] {
    if (in) works.push_back(group->recv(*in, kept_rank, tag));
  };
  if (group->rank() % 2 == 0) {
    send();
    receive();
  } else {
    receive();
    send();
  }
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

  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> where;  // param -> (unit, index)
  for (FsdpUnit* unit : model.unit().units_within()) {
    if (&unit->group() != s.group)
      throw InvalidArgument(fmt::format("ShardBackup: unit {} is sharded over another group than the root's; shard "
                                        "every unit over one group",
                                        unit->name()));
    UnitCopy copy;
    copy.unit = unit;
    unit->keep_gradient_memory();
    // A step with this copy's shard taken over folds in shard order: the
    // clean steps must too, for its bits to be theirs (host memory, as
    // that step's collectives are).
    if (unit->shard().is_cpu()) unit->options().reduce_in_shard_order = true;
    copy.own = pieces_with_elements(*unit, rank);
    copy.kept = pieces_with_elements(*unit, s.kept_rank);
    // Where the kept rank holds no element of the unit, nothing is kept.
    const auto elements = copy.kept.empty() ? 0 : unit->layout().shard_elements();
    copy.shard = ::torch::empty({elements}, unit->shard().options());
    copy.gradients = ::torch::empty({elements}, unit->shard().options());
    for (const ShardRange& piece : copy.kept) copy.pieces.push_back(copy.shard.narrow(0, piece.offset, piece.count));
    for (std::size_t i = 0; i < unit->params().size(); ++i)
      where[unit->params()[i].unsafeGetTensorImpl()] = {s.units.size(), i};
    s.units.push_back(std::move(copy));
  }

  // The copy's groups: the user's, each parameter replaced by the kept
  // rank's piece of it (none where that rank holds no element of it).
  std::vector<::torch::optim::OptimizerParamGroup> groups;
  std::size_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    std::vector<Tensor> views;
    for (const Tensor& p : group.params()) {
      const auto found = where.find(p.unsafeGetTensorImpl());
      if (found == where.end())
        throw InvalidArgument(fmt::format("ShardBackup: the optimizer's parameter {} (sizes {}) is not a parameter of "
                                          "the model's units; build the optimizer over model->parameters()",
                                          index, p.sizes()));
      const auto [u, i] = found->second;
      const UnitCopy& copy = s.units[u];
      for (std::size_t k = 0; k < copy.kept.size(); ++k)
        if (copy.kept[k].param == i) views.push_back(copy.pieces[k]);
      for (const ShardRange& piece : copy.own)
        if (piece.param == i) {
          s.own_indices.push_back(index);
          s.own_params.push_back(p);
        }
      ++index;
    }
    groups.emplace_back(std::move(views), group.options().clone());
  }
  s.copy = zero_pieces::same_type(optimizer, std::move(groups));
  s.fused_adam = typeid(optimizer) == typeid(::torch::optim::Adam) && detail::fused_adam_matches();
  std::size_t params = 0;
  for (const UnitCopy& copy : s.units) params += copy.unit->params().size();
  s.flags_out.assign(params, 0);
  s.flags_in.assign(params, 0);
  s.exchange_shards();
  s.exchange_optimizer_state();
}

ShardBackup::~ShardBackup() {
  // A transfer send_gradients() started writes into this object's buffers
  // until it ends.
  for (const auto& work : state_->in_flight) {
    try {
      work->wait();
    } catch (const std::exception&) {
      // The group failed; it says so to whoever uses it next.
    }
  }
}

// Every unit's shard to the next rank; the kept rank's into the copy.
void ShardBackup::State::exchange_shards() {
  std::vector<std::shared_ptr<Work>> works;
  for (std::size_t u = 0; u < units.size(); ++u) {
    UnitCopy& copy = units[u];
    std::optional<ConstBuffer> out;
    std::optional<Buffer> in;
    if (!copy.own.empty()) out = buffer_of(copy.unit->shard(), "a unit's shard");
    if (!copy.kept.empty()) in = buffer_of(copy.shard, "the copy of a unit's shard");
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
  const std::vector<Tensor> pieces = params_of(*copy);
  std::vector<std::int64_t> table_in(2 * pieces.size(), StateTable::kNoState);
  std::optional<ConstBuffer> table_to_next;
  std::optional<Buffer> table_from_kept;
  if (!mine.entries.empty()) table_to_next = ConstBuffer{mine.entries.data(), mine.entries.size(), DType::i64};
  if (!table_in.empty()) table_from_kept = Buffer{table_in.data(), table_in.size(), DType::i64};
  std::vector<std::shared_ptr<Work>> works;
  exchange(works, table_to_next, table_from_kept, kBackupStateTableTag);
  wait_all(works);
  works.clear();

  const std::vector<Tensor>& tensors_out = mine.tensors;
  const std::vector<Tensor> tensors_in = states_from_table(*copy, pieces, table_in);
  // As many out as the next rank's table says come in; a piece's tensor of
  // another size than the copy's piece fails the receive, named.
  for (std::size_t k = 0; k < std::max(tensors_out.size(), tensors_in.size()); ++k) {
    std::optional<ConstBuffer> out;
    std::optional<Buffer> in;
    if (k < tensors_out.size()) out = buffer_of(tensors_out[k], "a piece's optimizer state");
    if (k < tensors_in.size()) in = buffer_of(tensors_in[k], "the copy of a piece's optimizer state");
    exchange(works, out, in, kBackupStateTensorTag);
  }
  wait_all(works);
}

// This rank's gradients (the ones its optimizer steps with) to the next
// rank, with a flag per parameter saying which have one; the kept rank's
// into the copy's gradient buffers (receive_gradients waits for them).
void ShardBackup::State::send_gradients() {
  ::torch::NoGradGuard no_grad;
  std::size_t flag = 0;
  for (UnitCopy& copy : units)
    for (std::size_t i = 0; i < copy.unit->params().size(); ++i, ++flag)
      flags_out[flag] = copy.unit->params()[i].grad().defined() ? 1 : 0;
  exchange(in_flight, ConstBuffer{flags_out.data(), flags_out.size(), DType::i32},
           Buffer{flags_in.data(), flags_in.size(), DType::i32}, kBackupFlagsTag);
  for (std::size_t u = 0; u < units.size(); ++u) {
    UnitCopy& copy = units[u];
    std::optional<ConstBuffer> out;
    std::optional<Buffer> in;
    if (!copy.kept.empty()) in = buffer_of(copy.gradients, "the kept rank's gradients");
    if (copy.own.empty()) {
      // No element of this unit here: nothing to send.
    } else if (const Tensor* laid = gradients_laid_as_shard(copy)) {
      out = buffer_of(*laid, "a unit's reduced gradients");
    } else {
      if (!copy.outgoing.defined()) copy.outgoing = ::torch::zeros({copy.unit->layout().shard_elements()}, copy.unit->shard().options());
      for (const ShardRange& piece : copy.own) {
        const Tensor& grad = copy.unit->params()[piece.param].grad();
        if (grad.defined()) copy.outgoing.narrow(0, piece.offset, piece.count).copy_(grad.reshape({-1}));
      }
      out = buffer_of(copy.outgoing, "a unit's gradients");
    }
    exchange(in_flight, out, in, kBackupFirstUnitTag + static_cast<int>(u));
  }
}

void ShardBackup::State::receive_gradients() {
  // Every one waited for, even after a failure: none may write into a buffer later.
  const std::vector<std::shared_ptr<Work>> transfers = std::move(in_flight);
  in_flight.clear();
  wait_all(transfers);
  std::size_t flag = 0;
  for (UnitCopy& copy : units) {
    std::size_t next_kept = 0;
    for (std::size_t i = 0; i < copy.unit->params().size(); ++i, ++flag) {
      if (next_kept >= copy.kept.size() || copy.kept[next_kept].param != i) continue;
      const ShardRange& piece = copy.kept[next_kept];
      Tensor& view = copy.pieces[next_kept++];
      view.mutable_grad() = flags_in[flag] != 0 ? copy.gradients.narrow(0, piece.offset, piece.count) : Tensor();
    }
  }
}

void ShardBackup::send_gradients() {
  State& s = *state_;
  if (s.in_flight.empty()) s.send_gradients();
}

void ShardBackup::step() {
  State& s = *state_;
  if (s.in_flight.empty()) s.send_gradients();
  s.receive_gradients();
  s.step_copy();
}

// The copy's optimizer, with the user's options of now (a scheduler's).
void ShardBackup::State::step_copy() {
  zero_pieces::copy_options(user->param_groups(), copy->param_groups());
  if (fused_adam && detail::fused_adam_applies(*copy)) {
    detail::fused_adam_step(*copy);
  } else {
    copy->step();
  }
}

void ShardBackup::verify() {
  State& s = *state_;
  zero_pieces::copy_options(s.user->param_groups(), s.copy->param_groups());
  // Parameters' bytes, then the optimizer's learning rates and state: this
  // rank's own, and its copy of the kept rank's.
  std::uint64_t digests[2] = {digest_of(s.own_params, kDigestStart), 0};
  digests[0] = digest_of(*s.user, digests[0], &s.own_indices);
  // The copy's parameters in its groups' order, which is the user's
  // groups' order of the kept rank's own parameters.
  digests[1] = digest_of(*s.copy, digest_of(params_of(*s.copy), kDigestStart));
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
  std::size_t out = state_bytes(*state_->copy);
  for (const UnitCopy& copy : state_->units)
    out += copy.shard.nbytes() + copy.gradients.nbytes() + (copy.outgoing.defined() ? copy.outgoing.nbytes() : 0);
  return out;
}

std::vector<Tensor> ShardBackup::pieces() const {
  std::vector<Tensor> out;
  for (const UnitCopy& copy : state_->units) out.insert(out.end(), copy.pieces.begin(), copy.pieces.end());
  return out;
}

::torch::optim::Optimizer& ShardBackup::optimizer() { return *state_->copy; }

std::vector<Tensor> ShardBackup::kept_blocks() const {
  std::vector<Tensor> out;
  for (const UnitCopy& copy : state_->units)
    out.push_back(copy.kept.empty() ? ::torch::zeros({copy.unit->layout().shard_elements()}, copy.unit->shard().options())
                                    : copy.shard);
  return out;
}

void ShardBackup::step_kept(const std::vector<Tensor>& gradients) {
  State& s = *state_;
  if (gradients.size() != s.units.size())
    throw InvalidArgument(fmt::format("ShardBackup::step_kept: {} gradient blocks for a model of {} units",
                                      gradients.size(), s.units.size()));
  for (std::size_t u = 0; u < s.units.size(); ++u) {
    const UnitCopy& copy = s.units[u];
    const Tensor& reduced = gradients[u];
    if (reduced.defined() && !copy.kept.empty() &&
        (reduced.numel() != copy.gradients.numel() || reduced.scalar_type() != copy.gradients.scalar_type()))
      throw InvalidArgument(fmt::format(
          "ShardBackup::step_kept: unit {}'s gradients are {} elements of {}; its shard is {} of {}",
          copy.unit->name(), reduced.numel(), c10::toString(reduced.scalar_type()), copy.gradients.numel(),
          c10::toString(copy.gradients.scalar_type())));
  }
  ::torch::NoGradGuard no_grad;
  for (std::size_t u = 0; u < s.units.size(); ++u) {
    UnitCopy& copy = s.units[u];
    const Tensor& reduced = gradients[u];
    if (reduced.defined() && !copy.kept.empty()) copy.gradients.copy_(reduced);
    for (std::size_t k = 0; k < copy.kept.size(); ++k) {
      const ShardRange& piece = copy.kept[k];
      copy.pieces[k].mutable_grad() = reduced.defined() && copy.unit->reduced_gradient(piece.param)
                                          ? copy.gradients.narrow(0, piece.offset, piece.count)
                                          : Tensor();
    }
  }
  s.step_copy();
}

}  // namespace lockstep::torch
