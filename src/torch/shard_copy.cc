// ShardCopy; see shard_copy.h.
#include "shard_copy.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <typeinfo>
#include <utility>

#include "fused_adam.h"
#include "lockstep/error.h"
#include "lockstep/torch/ddp.h"
#include "optimizer_state.h"
#include "zero_pieces.h"

namespace lockstep::torch::detail {

using ::torch::Tensor;

std::vector<ShardRange> pieces_with_elements(const FsdpUnit& unit, int shard) {
  std::vector<ShardRange> out;
  for (std::size_t i = 0; i < unit.params().size(); ++i) {
    const auto piece = unit.layout().piece_of(shard, i);
    if (piece.count > 0) out.push_back({i, piece.shard_offset, piece.count});
  }
  return out;
}

namespace {

// Where each of the units' parameters is: (unit, index in the unit).
std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> locations(const std::vector<FsdpUnit*>& units) {
  std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>> where;
  for (std::size_t u = 0; u < units.size(); ++u)
    for (std::size_t i = 0; i < units[u]->params().size(); ++i)
      where[units[u]->params()[i].unsafeGetTensorImpl()] = {u, i};
  return where;
}

std::pair<std::size_t, std::size_t> location_of(
    const std::map<const c10::TensorImpl*, std::pair<std::size_t, std::size_t>>& where, const Tensor& p,
    std::size_t index) {
  const auto found = where.find(p.unsafeGetTensorImpl());
  if (found == where.end())
    throw InvalidArgument(fmt::format("ShardBackup: the optimizer's parameter {} (sizes {}) is not a parameter of "
                                      "the model's units; build the optimizer over model->parameters()",
                                      index, p.sizes()));
  return found->second;
}

}  // namespace

ParamsInShard params_in_shard(const std::vector<FsdpUnit*>& units, const ::torch::optim::Optimizer& user, int shard) {
  const auto where = locations(units);
  ParamsInShard out;
  std::size_t index = 0;
  for (const auto& group : user.param_groups())
    for (const Tensor& p : group.params()) {
      const auto [u, i] = location_of(where, p, index);
      if (units[u]->layout().piece_of(shard, i).count > 0) {
        out.indices.push_back(index);
        out.params.push_back(p);
      }
      ++index;
    }
  return out;
}

void ring_exchange(ProcessGroup& group, int next, int prev, std::vector<std::shared_ptr<Work>>& works,
                   std::optional<ConstBuffer> out, std::optional<Buffer> in, int tag) {
  const auto send = [&] {
    if (out) works.push_back(group.send(*out, next, tag));
  };
  const auto receive = [&] {
    if (in) works.push_back(group.recv(*in, prev, tag));
  };
  if (group.rank() % 2 == 0) {
    send();
    receive();
  } else {
    receive();
    send();
  }
}

OwnShard::OwnShard(const std::vector<FsdpUnit*>& units, int shard) {
  for (FsdpUnit* unit : units) units_.push_back(Unit{unit, pieces_with_elements(*unit, shard), Tensor()});
}

void OwnShard::flags(std::vector<std::int32_t>& out) const {
  out.clear();
  for (const Unit& own : units_)
    for (const Tensor& p : own.unit->params()) out.push_back(p.grad().defined() ? 1 : 0);
}

namespace {

// The reduced shard this rank's gradients of the unit are views of, each
// at its piece's place, or null: what fully_shard leaves them (and
// accumulates into in place), sent then as it is, with no copy.
const Tensor* gradients_laid_as_shard(const FsdpUnit& unit, const std::vector<ShardRange>& own) {
  const Tensor& memory = unit.gradient_memory();
  if (own.empty() || !memory.defined() || !memory.is_cpu() || memory.numel() != unit.layout().shard_elements() ||
      memory.scalar_type() != unit.dtype())
    return nullptr;
  for (const ShardRange& piece : own) {
    const Tensor& grad = unit.params()[piece.param].grad();
    if (!grad.defined() || !grad.is_contiguous() || grad.numel() != piece.count ||
        grad.scalar_type() != memory.scalar_type() ||
        grad.data_ptr() != static_cast<const char*>(memory.data_ptr()) + piece.offset * memory.element_size())
      return nullptr;
  }
  return &memory;
}

}  // namespace

const Tensor& OwnShard::gradients(std::size_t u) {
  Unit& own = units_[u];
  if (const Tensor* laid = gradients_laid_as_shard(*own.unit, own.own)) return *laid;
  ::torch::NoGradGuard no_grad;
  if (!own.outgoing.defined())
    own.outgoing = ::torch::zeros({own.unit->layout().shard_elements()}, own.unit->shard().options());
  for (const ShardRange& piece : own.own) {
    const Tensor& grad = own.unit->params()[piece.param].grad();
    if (grad.defined()) own.outgoing.narrow(0, piece.offset, piece.count).copy_(grad.reshape({-1}));
  }
  return own.outgoing;
}

std::size_t OwnShard::bytes() const {
  std::size_t out = 0;
  for (const Unit& own : units_) out += own.outgoing.defined() ? own.outgoing.nbytes() : 0;
  return out;
}

ShardCopy::ShardCopy(const std::vector<FsdpUnit*>& units, const ::torch::optim::Optimizer& user, int shard)
    : shard_(shard) {
  for (FsdpUnit* unit : units) {
    Unit copy;
    copy.unit = unit;
    copy.kept = pieces_with_elements(*unit, shard);
    // Where the shard holds no element of the unit, nothing is kept.
    const auto elements = copy.kept.empty() ? 0 : unit->layout().shard_elements();
    copy.block = ::torch::empty({elements}, unit->shard().options());
    copy.gradients = ::torch::empty({elements}, unit->shard().options());
    for (const ShardRange& piece : copy.kept) copy.pieces.push_back(copy.block.narrow(0, piece.offset, piece.count));
    units_.push_back(std::move(copy));
  }

  // The user's groups, each parameter replaced by the shard's piece of it
  // (none where the shard holds no element of it).
  const auto where = locations(units);
  std::vector<::torch::optim::OptimizerParamGroup> groups;
  std::size_t index = 0;
  for (const auto& group : user.param_groups()) {
    std::vector<Tensor> views;
    for (const Tensor& p : group.params()) {
      const auto [u, i] = location_of(where, p, index);
      const Unit& copy = units_[u];
      for (std::size_t k = 0; k < copy.kept.size(); ++k)
        if (copy.kept[k].param == i) views.push_back(copy.pieces[k]);
      ++index;
    }
    groups.emplace_back(std::move(views), group.options().clone());
  }
  optimizer_ = zero_pieces::same_type(user, std::move(groups));
  fused_adam_ = typeid(user) == typeid(::torch::optim::Adam) && fused_adam_matches();
}

std::vector<Tensor> ShardCopy::blocks() const {
  std::vector<Tensor> out;
  for (const Unit& copy : units_)
    out.push_back(copy.kept.empty()
                      ? ::torch::zeros({copy.unit->layout().shard_elements()}, copy.unit->shard().options())
                      : copy.block);
  return out;
}

std::vector<Tensor> ShardCopy::pieces() const {
  std::vector<Tensor> out;
  for (const Unit& copy : units_) out.insert(out.end(), copy.pieces.begin(), copy.pieces.end());
  return out;
}

void ShardCopy::use_received_gradients(const std::vector<std::int32_t>& flags) {
  std::size_t flag = 0;
  for (Unit& copy : units_) {
    std::size_t next_kept = 0;
    for (std::size_t i = 0; i < copy.unit->params().size(); ++i, ++flag) {
      if (next_kept >= copy.kept.size() || copy.kept[next_kept].param != i) continue;
      const ShardRange& piece = copy.kept[next_kept];
      Tensor& view = copy.pieces[next_kept++];
      view.mutable_grad() = flags[flag] != 0 ? copy.gradients.narrow(0, piece.offset, piece.count) : Tensor();
    }
  }
}

void ShardCopy::flags(std::vector<std::int32_t>& out) const {
  out.clear();
  for (const Unit& copy : units_) {
    std::size_t next_kept = 0;
    for (std::size_t i = 0; i < copy.unit->params().size(); ++i) {
      const bool kept = next_kept < copy.kept.size() && copy.kept[next_kept].param == i;
      out.push_back(kept && copy.pieces[next_kept].grad().defined() ? 1 : 0);
      if (kept) ++next_kept;
    }
  }
}

void ShardCopy::use_reduced_gradients(const std::vector<Tensor>& reduced, const char* who) {
  if (reduced.size() != units_.size())
    throw InvalidArgument(fmt::format("{}: {} gradient blocks for a model of {} units", who, reduced.size(),
                                      units_.size()));
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& copy = units_[u];
    const Tensor& block = reduced[u];
    if (block.defined() && !copy.kept.empty() &&
        (block.numel() != copy.gradients.numel() || block.scalar_type() != copy.gradients.scalar_type()))
      throw InvalidArgument(fmt::format("{}: unit {}'s gradients are {} elements of {}; its shard is {} of {}", who,
                                        copy.unit->name(), block.numel(), c10::toString(block.scalar_type()),
                                        copy.gradients.numel(), c10::toString(copy.gradients.scalar_type())));
  }
  ::torch::NoGradGuard no_grad;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    Unit& copy = units_[u];
    const Tensor& block = reduced[u];
    if (block.defined() && !copy.kept.empty()) copy.gradients.copy_(block);
    for (std::size_t k = 0; k < copy.kept.size(); ++k) {
      const ShardRange& piece = copy.kept[k];
      copy.pieces[k].mutable_grad() = block.defined() && copy.unit->reduced_gradient(piece.param)
                                          ? copy.gradients.narrow(0, piece.offset, piece.count)
                                          : Tensor();
    }
  }
}

void ShardCopy::step(const ::torch::optim::Optimizer& user) {
  zero_pieces::copy_options(user.param_groups(), optimizer_->param_groups());
  // libtorch's Adam makes eight passes over a piece, its state and its
  // gradient; on ranks whose cores are busy the copy's step costs its
  // whole length.
  if (fused_adam_ && fused_adam_applies(*optimizer_)) {
    fused_adam_step(*optimizer_);
  } else {
    optimizer_->step();
  }
}

void ring_exchange_optimizer_state(ProcessGroup& group, int next, int prev, const StateTable* mine, ShardCopy* kept,
                                   int table_tag, int tensor_tag) {
  std::vector<Tensor> pieces;
  if (kept) pieces = params_of(kept->optimizer());
  std::vector<std::int64_t> table_in(2 * pieces.size(), StateTable::kNoState);
  std::optional<ConstBuffer> table_out;
  std::optional<Buffer> table_from_prev;
  if (mine && !mine->entries.empty()) table_out = ConstBuffer{mine->entries.data(), mine->entries.size(), DType::i64};
  if (!table_in.empty()) table_from_prev = Buffer{table_in.data(), table_in.size(), DType::i64};
  std::vector<std::shared_ptr<Work>> works;
  ring_exchange(group, next, prev, works, table_out, table_from_prev, table_tag);
  wait_all(works);
  works.clear();

  const std::vector<Tensor> none;
  const std::vector<Tensor>& tensors_out = mine ? mine->tensors : none;
  std::vector<Tensor> tensors_in;
  if (kept) tensors_in = states_from_table(kept->optimizer(), pieces, table_in);
  // As many out as the next rank's table says come in; a piece's tensor of
  // another size than the copy's piece fails the receive, named.
  for (std::size_t k = 0; k < std::max(tensors_out.size(), tensors_in.size()); ++k) {
    std::optional<ConstBuffer> out;
    std::optional<Buffer> in;
    if (k < tensors_out.size()) out = buffer_of(tensors_out[k], "a piece's optimizer state");
    if (k < tensors_in.size()) in = buffer_of(tensors_in[k], "the copy of a piece's optimizer state");
    ring_exchange(group, next, prev, works, out, in, tensor_tag);
  }
  wait_all(works);
}

std::size_t ShardCopy::bytes() const {
  std::size_t out = state_bytes(*optimizer_);
  for (const Unit& copy : units_) out += copy.block.nbytes() + copy.gradients.nbytes();
  return out;
}

}  // namespace lockstep::torch::detail
