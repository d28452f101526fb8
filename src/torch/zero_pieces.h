// The pure parts of ZeroRedundancyOptimizer's balanced_elements partition:
// where the equal ranges of elements cut the parameters, which optimizers
// may step such cuts (and an optimizer of the same type to step them), and
// how the per-parameter state of a cut tensor is split into its pieces'
// states and merged back. Stateless; thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "lockstep/torch/zero.h"

namespace lockstep::torch::zero_pieces {

using Piece = detail::ZeroPiece;

// Tensors of `numels` elements laid end to end, in order; rank r gets the
// elements [r * c, (r + 1) * c), c = ceil(total / ranks) (the last rank
// fewer), so a tensor crossing a boundary is cut into pieces. Returns the
// pieces in order (by tensor, then by first element); `param` indexes
// `numels`. An empty tensor is one piece of its place's rank.
std::vector<Piece> partition_balanced(const std::vector<std::int64_t>& numels, int ranks);

// The elements each rank holds in the balanced partition: c above (at least 1).
std::int64_t balanced_chunk(std::int64_t total, int ranks);

// Whether `optimizer` is exactly SGD, Adam, AdamW, Adagrad or RMSprop:
// optimizers that update each element from its own gradient and state
// only, so stepping the pieces of a tensor equals stepping the tensor.
// Subclasses are not: their step() could look at whole tensors.
bool steps_elementwise(const ::torch::optim::Optimizer& optimizer);

// An optimizer of `like`'s type (one steps_elementwise accepts) over
// `groups`, with `like`'s defaults: what steps pieces of its parameters.
std::unique_ptr<::torch::optim::Optimizer> same_type(const ::torch::optim::Optimizer& like,
                                                     std::vector<::torch::optim::OptimizerParamGroup> groups);

// Each group's options of `from` (a scheduler's learning rate, say) into
// the same group of `to`.
void copy_options(const std::vector<::torch::optim::OptimizerParamGroup>& from,
                  std::vector<::torch::optim::OptimizerParamGroup>& to);

// The state of elements [begin, begin + count) of a parameter, from the
// whole parameter's state: each tensor entry flattened and cut (a copy),
// scalar entries (Adam's step) as they are.
std::unique_ptr<::torch::optim::OptimizerParamState> slice_state(const ::torch::optim::OptimizerParamState& whole,
                                                                std::int64_t begin, std::int64_t count);

// The state of a whole parameter of shape `sizes` from its pieces' states,
// in order of their elements: tensor entries concatenated and reshaped,
// scalar entries taken from the first (every piece stepped alike).
std::unique_ptr<::torch::optim::OptimizerParamState> merge_states(
    const std::vector<const ::torch::optim::OptimizerParamState*>& pieces, c10::IntArrayRef sizes);

}  // namespace lockstep::torch::zero_pieces
