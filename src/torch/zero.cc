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
#include "optimizer_bytes.h"
#include "optimizer_state.h"
#include "zero_overlap_state.h"
#include "zero_pieces.h"

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

// Said when add_param_group() meets the balanced_elements partition.
constexpr const char* kNoGroupsLater =
    "ZeroRedundancyOptimizer: add_param_group() cannot be used with ZeroPartition::balanced_elements: the new "
    "parameters would move every rank's range of elements, and the optimizer state with it. Pass every group to "
    "the constructor, or use ZeroPartition::by_tensor";

// Where the pieces of one dtype sit in the buffer the all-gather fills:
// one block per rank, in rank order, each rank's pieces in order in its
// block. `padded`: every block as long as the longest (one allgather of
// equal blocks); else each as long as its pieces (an allgather with
// per-rank counts, no memory wasted).
struct GatherLayout {
  std::vector<std::size_t> pieces;    // indices into the pieces, of this dtype
  std::vector<std::int64_t> offsets;  // by entry of `pieces`
  std::vector<std::int64_t> block_begin, block_count;  // by rank
  std::int64_t size = 0;
  bool equal_blocks() const {
    return std::adjacent_find(block_count.begin(), block_count.end(), std::not_equal_to<>()) == block_count.end();
  }
};

GatherLayout gather_layout(const std::vector<detail::ZeroPiece>& pieces, const std::vector<Tensor>& params,
                           ::torch::ScalarType type, int ranks, bool padded) {
  GatherLayout layout;
  layout.block_count.assign(static_cast<std::size_t>(ranks), 0);
  std::vector<std::int64_t> position;  // of each entry in its rank's block
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    if (params[pieces[k].param].scalar_type() != type) continue;
    layout.pieces.push_back(k);
    auto& count = layout.block_count[static_cast<std::size_t>(pieces[k].owner)];
    position.push_back(count);
    count += pieces[k].count;
  }
  if (padded) {
    const std::int64_t longest = *std::max_element(layout.block_count.begin(), layout.block_count.end());
    std::fill(layout.block_count.begin(), layout.block_count.end(), longest);
  }
  for (const auto count : layout.block_count) {
    layout.block_begin.push_back(layout.size);
    layout.size += count;
  }
  for (std::size_t e = 0; e < layout.pieces.size(); ++e)
    layout.offsets.push_back(layout.block_begin[static_cast<std::size_t>(pieces[layout.pieces[e]].owner)] +
                             position[e]);
  return layout;
}

// A parameter's elements [begin, begin + count), flattened: the parameter
// must be contiguous (checked where tensors are cut).
Tensor elements_of(const Tensor& param, std::int64_t begin, std::int64_t count) {
  return param.detach().view({-1}).narrow(0, begin, count);
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> parameters, std::shared_ptr<ProcessGroup> group,
                                                 OptimizerFactory make_optimizer, ZeroOptions zero_options)
    : ZeroRedundancyOptimizer(std::vector<ParamGroup>{ParamGroup(std::move(parameters))}, std::move(group),
                              std::move(make_optimizer), zero_options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<ParamGroup> param_groups,
                                                 std::shared_ptr<ProcessGroup> group, OptimizerFactory make_optimizer,
                                                 ZeroOptions zero_options)
    : Optimizer(param_groups, checked_defaults(param_groups, make_optimizer)),
      group_(std::move(group)),
      make_optimizer_(std::move(make_optimizer)),
      zero_options_(zero_options) {
  if (!group_) throw InvalidArgument("ZeroRedundancyOptimizer needs a process group (lockstep::init_process_group())");
  if (zero_options_.partition == ZeroPartition::balanced_elements) {
    const Tensor probe = ::torch::zeros({1}, param_groups_[0].params().at(0).options().requires_grad(false));
    if (!zero_pieces::steps_elementwise(*make_optimizer_({probe})))
      throw InvalidArgument(
          "ZeroRedundancyOptimizer: ZeroPartition::balanced_elements steps cuts of tensors, which only optimizers "
          "that update each element on its own allow: the factory must make exactly torch::optim::SGD, Adam, AdamW, "
          "Adagrad or RMSprop (or pass their Options). Use ZeroPartition::by_tensor for any other optimizer");
  }
  load_.assign(static_cast<std::size_t>(group_->size()), 0);
  sync_groups();
}

// Takes in the groups added since the last call (all of them at
// construction): checks their parameters, shares them out, and gives this
// rank's part of each to its optimizer (made once it has a parameter).
void ZeroRedundancyOptimizer::sync_groups() {
  if (groups_seen_ == param_groups_.size()) return;
  const bool balanced = zero_options_.partition == ZeroPartition::balanced_elements;
  if (balanced && groups_seen_ > 0) throw InvalidArgument(kNoGroupsLater);
  const std::size_t first_new = groups_seen_;
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
      if (balanced && !p.is_contiguous())
        throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer: parameter {} is not contiguous; "
                                          "ZeroPartition::balanced_elements cuts parameters as flat ranges (make it "
                                          "contiguous, or use ZeroPartition::by_tensor)",
                                          i));
      parameters_.push_back(p);
      group_of_.push_back(g);
    }
    for (const int owner : partition(params, load_)) owners_.push_back(owner);
  }
  groups_seen_ = param_groups_.size();
  share_out();
  // The buffers before the cuts: a cut is a view of its parameter's memory.
  if (zero_options_.parameters_as_bucket_view) make_bucket_views();
  make_piece_tensors();
  if (local_)
    for (std::size_t g = first_new; g < param_groups_.size(); ++g)
      local_->add_param_group(ParamGroup(shard_of(group_->rank(), g), param_groups_[g].options().clone()));
  if (!local_ && !shard_of(group_->rank()).empty()) local_ = optimizer_over(group_->rank());
}

// The pieces: each parameter whole to its owner (by_tensor), or each
// dtype's parameters cut into equal ranges (balanced_elements; owners_
// then names the owner of each parameter's first element).
void ZeroRedundancyOptimizer::share_out() {
  pieces_.clear();
  if (zero_options_.partition == ZeroPartition::by_tensor) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) pieces_.push_back({i, 0, parameters_[i].numel(), owners_[i]});
    return;
  }
  std::map<::torch::ScalarType, std::vector<std::size_t>> by_type;  // ordered: the same on every rank
  for (std::size_t i = 0; i < parameters_.size(); ++i) by_type[parameters_[i].scalar_type()].push_back(i);
  for (const auto& [type, indices] : by_type) {
    std::vector<std::int64_t> numels;
    for (const auto i : indices) numels.push_back(parameters_[i].numel());
    std::int64_t last = -1;
    for (auto piece : zero_pieces::partition_balanced(numels, group_->size())) {
      piece.param = indices[piece.param];
      if (static_cast<std::int64_t>(piece.param) != last) owners_[piece.param] = piece.owner;
      last = static_cast<std::int64_t>(piece.param);
      pieces_.push_back(piece);
    }
  }
}

// parameters_as_bucket_view: copies each dtype's parameters into one
// buffer laid out as the all-gather fills it, and makes each parameter a
// view of its place. set_data() keeps the tensor object, so the model,
// DDP's autograd hooks and the optimizers' state keys stay with it. A
// parameter's pieces are adjacent in both layouts, so it is one view.
void ZeroRedundancyOptimizer::make_bucket_views() {
  ::torch::NoGradGuard no_grad;
  std::map<::torch::ScalarType, Tensor> buckets;
  for (const auto& p : parameters_) buckets.emplace(p.scalar_type(), Tensor());
  for (auto& [type, bucket] : buckets) {
    const auto layout = gather_layout(pieces_, parameters_, type, group_->size(), bucket_padded());
    bucket = ::torch::zeros({layout.size}, parameters_[pieces_[layout.pieces[0]].param].options().requires_grad(false));
    for (std::size_t e = 0; e < layout.pieces.size(); ++e) {
      const auto& piece = pieces_[layout.pieces[e]];
      if (piece.begin != 0) continue;  // the parameter's view starts at its first piece
      Tensor& p = parameters_[piece.param];
      Tensor view = bucket.narrow(0, layout.offsets[e], p.numel()).view(p.sizes());
      view.copy_(p.detach());
      p.set_data(view);
    }
  }
  buckets_ = std::move(buckets);
}

// Whether each bucket pads every rank's block to the longest: with
// balanced_elements the blocks differ by less than one element per rank;
// with by_tensor one dominant tensor would make the padding most of the
// buffer, so the blocks are exact and the all-gather takes counts.
bool ZeroRedundancyOptimizer::bucket_padded() const {
  return zero_options_.partition == ZeroPartition::balanced_elements;
}

// A whole piece is stepped as its parameter; a cut one as a flat view of
// its elements, a leaf of its own (its gradient is set before each step).
void ZeroRedundancyOptimizer::make_piece_tensors() {
  piece_tensors_.clear();
  for (const auto& piece : pieces_) {
    const Tensor& p = parameters_[piece.param];
    if (piece.begin == 0 && piece.count == p.numel()) {
      piece_tensors_.push_back(p);
    } else {
      piece_tensors_.push_back(elements_of(p, piece.begin, piece.count).requires_grad_(p.requires_grad()));
    }
  }
}

bool ZeroRedundancyOptimizer::is_cut(std::size_t piece) const {
  return pieces_[piece].count != parameters_[pieces_[piece].param].numel();
}

void ZeroRedundancyOptimizer::add_param_group(const ParamGroup& param_group) {
  if (zero_options_.partition == ZeroPartition::balanced_elements) throw InvalidArgument(kNoGroupsLater);
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
  for (std::size_t k = 0; k < pieces_.size(); ++k)
    if (pieces_[k].owner == rank) shard.push_back(piece_tensors_[k]);
  return shard;
}

std::vector<Tensor> ZeroRedundancyOptimizer::shard_of(int rank, std::size_t group) const {
  std::vector<Tensor> shard;
  for (std::size_t k = 0; k < pieces_.size(); ++k)
    if (pieces_[k].owner == rank && group_of_[pieces_[k].param] == group) shard.push_back(piece_tensors_[k]);
  return shard;
}

// Steps the shard, then one allgather per dtype (gather()).
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
  // DDP rescales the averages for the ranks that joined only after every
  // bucket's hook has run, so a shard stepped inside the hook would use
  // averages over the whole group.
  if (zero_options_.overlap_with_ddp)
    throw InvalidArgument(
        "ZeroRedundancyOptimizer with overlap_with_ddp cannot take part in a Join (uneven inputs); build it without "
        "overlap_with_ddp to train under Join");
  return std::make_unique<JoinedStep>(*this);
}

void ZeroRedundancyOptimizer::step_shard_and_gather() {
  sync_groups();
  if (zero_options_.overlap_with_ddp && group_->size() > 1) {
    // hook_with_zero_step stepped the shard during backward, bucket by
    // bucket (a world of one has no reductions, so no hook runs there).
    detail::ZeroOverlap::finish_step(*this);
  } else if (local_) {
    // A scheduler (or the user) changes the options of param_groups().
    zero_pieces::copy_options(param_groups_, local_->param_groups());
    give_cut_pieces_their_gradients();
    local_->step();
    // Views of the gradients: kept, they would keep a gradient that
    // zero_grad(true) drops alive until the next step.
    drop_cut_pieces_gradients();
  }
  const int ranks = group_->size();
  if (ranks == 1) return;
  ::torch::NoGradGuard no_grad;
  std::map<::torch::ScalarType, int> types;  // ordered: the same on every rank
  for (const auto& p : parameters_) types.emplace(p.scalar_type(), 0);
  for (const auto& [type, unused] : types) gather(type);
}

// A cut piece's gradient: the same elements of its parameter's gradient
// (a view, no copy, where DDP left it contiguous); none where it has none.
void ZeroRedundancyOptimizer::give_cut_pieces_their_gradients() {
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    if (pieces_[k].owner != group_->rank() || !is_cut(k)) continue;
    const Tensor& grad = parameters_[pieces_[k].param].grad();
    piece_tensors_[k].mutable_grad() =
        grad.defined() ? grad.detach().reshape({-1}).narrow(0, pieces_[k].begin, pieces_[k].count) : Tensor();
  }
}

void ZeroRedundancyOptimizer::drop_cut_pieces_gradients() {
  for (std::size_t k = 0; k < pieces_.size(); ++k)
    if (is_cut(k)) piece_tensors_[k].mutable_grad().reset();
}

// One dtype's all-gather (gather_layout). With bucket views the buffer is
// the parameters' memory: this rank's block is copied out as the send
// buffer (backends do not all take an input inside the output) and the
// others' blocks land in their parameters. Else every rank packs its
// pieces into a block, the blocks are gathered into a new buffer and the
// other ranks' pieces copied out into the parameters. On a GPU the copies
// and the allgather are ordered by the current stream (wait() makes it
// wait for the allgather): the host never waits for the device.
void ZeroRedundancyOptimizer::gather(::torch::ScalarType type) {
  const int me = group_->rank();
  const bool in_bucket = zero_options_.parameters_as_bucket_view;
  const auto layout = gather_layout(pieces_, parameters_, type, group_->size(), !in_bucket || bucket_padded());
  if (layout.size == 0) return;
  const auto mine = static_cast<std::size_t>(me);
  Tensor all, send;
  if (in_bucket) {
    all = buckets_.at(type);
    send = all.narrow(0, layout.block_begin[mine], layout.block_count[mine]).clone();
  } else {
    all = ::torch::empty({layout.size}, parameters_[pieces_[layout.pieces[0]].param].options().requires_grad(false));
    send = ::torch::zeros({layout.block_count[mine]}, all.options());
    for (std::size_t e = 0; e < layout.pieces.size(); ++e) {
      const std::size_t k = layout.pieces[e];
      if (pieces_[k].owner != me) continue;
      send.narrow(0, layout.offsets[e] - layout.block_begin[mine], pieces_[k].count)
          .copy_(piece_tensors_[k].detach().reshape({-1}));
    }
  }
  try {
    const auto what = "a parameter of ZeroRedundancyOptimizer";
    if (layout.equal_blocks()) {
      group_->allgather(buffer_of(send, what), buffer_of(all, what))->wait();
    } else {
      std::vector<std::size_t> counts(layout.block_count.begin(), layout.block_count.end());
      group_->allgather(buffer_of(send, what), buffer_of(all, what), std::move(counts))->wait();
    }
  } catch (const TimeoutError& e) {
    if (join_config().enable) throw;
    throw TimeoutError(fmt::format("{}\n{}", e.what(), kNotInTheJoin), e.peer());
  } catch (const MismatchError& e) {
    if (join_config().enable) throw;
    throw MismatchError(fmt::format("{}\n{}", e.what(), kNotInTheJoin));
  }
  if (in_bucket) return;
  for (std::size_t e = 0; e < layout.pieces.size(); ++e) {
    const auto& piece = pieces_[layout.pieces[e]];
    if (piece.owner == me) continue;
    const Tensor got = all.narrow(0, layout.offsets[e], piece.count);
    Tensor& p = parameters_[piece.param];
    if (is_cut(layout.pieces[e])) elements_of(p, piece.begin, piece.count).copy_(got);
    else p.detach().copy_(got.view_as(p));
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
  PieceStates states(pieces_.size());
  if (local_) collect_states(*local_, me, states);
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
    collect_states(*theirs, r, states);
  }
  put_whole_states(states, *full);
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
  zero_pieces::copy_options(full->param_groups(), param_groups_);
  if (local_) {
    take_piece_states(*full);
    zero_pieces::copy_options(param_groups_, local_->param_groups());
  }
}

// The state `from` (an optimizer over `rank`'s shard) holds for each of
// that rank's pieces, copied into `states`.
void ZeroRedundancyOptimizer::collect_states(::torch::optim::Optimizer& from, int rank, PieceStates& states) const {
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    if (pieces_[k].owner != rank) continue;
    const auto it = from.state().find(libtorch::optimizer_state_key(piece_tensors_[k]));
    if (it != from.state().end()) states[k] = it->second->clone();
  }
}

// Each parameter's state into `full` (an optimizer over all parameters):
// a whole piece's as it is, a cut parameter's merged from its pieces'
// (none if a piece has none: it was never stepped).
void ZeroRedundancyOptimizer::put_whole_states(PieceStates& states, ::torch::optim::Optimizer& full) const {
  std::vector<std::vector<std::size_t>> pieces_of(parameters_.size());
  for (std::size_t k = 0; k < pieces_.size(); ++k) pieces_of[pieces_[k].param].push_back(k);
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    std::vector<const ::torch::optim::OptimizerParamState*> parts;
    for (const auto k : pieces_of[i])
      if (states[k]) parts.push_back(states[k].get());
    if (parts.empty() || parts.size() != pieces_of[i].size()) continue;
    const auto key = libtorch::optimizer_state_key(parameters_[i]);
    if (parts.size() == 1 && !is_cut(pieces_of[i][0])) full.state()[key] = std::move(states[pieces_of[i][0]]);
    else full.state()[key] = zero_pieces::merge_states(parts, parameters_[i].sizes());
  }
}

// This rank's pieces' state from `full` (an optimizer over all
// parameters, as loaded): a cut piece takes its elements of each entry.
void ZeroRedundancyOptimizer::take_piece_states(::torch::optim::Optimizer& full) {
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    if (pieces_[k].owner != group_->rank()) continue;
    const auto it = full.state().find(libtorch::optimizer_state_key(parameters_[pieces_[k].param]));
    if (it == full.state().end()) continue;
    local_->state()[libtorch::optimizer_state_key(piece_tensors_[k])] =
        is_cut(k) ? zero_pieces::slice_state(*it->second, pieces_[k].begin, pieces_[k].count) : it->second->clone();
  }
}

std::size_t optimizer_state_bytes(const ::torch::optim::Optimizer& optimizer) { return state_bytes(optimizer); }

}  // namespace lockstep::torch
