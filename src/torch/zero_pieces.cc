// The balanced_elements partition and the split and merge of a cut
// tensor's optimizer state. See zero_pieces.h. Stateless; thread-safe.
#include "zero_pieces.h"

#include <fmt/format.h>

#include <algorithm>
#include <typeinfo>

#include "lockstep/error.h"

namespace lockstep::torch::zero_pieces {
namespace {

namespace optim = ::torch::optim;
using ::torch::Tensor;

// The tensor entries of the state of one of the element-wise optimizers,
// in a fixed order (undefined where the option that needs one is off:
// amsgrad, RMSprop's momentum and centered).
std::vector<Tensor> tensors_of(const optim::OptimizerParamState& s) {
  if (auto* x = dynamic_cast<const optim::SGDParamState*>(&s)) return {x->momentum_buffer()};
  if (auto* x = dynamic_cast<const optim::AdamParamState*>(&s)) return {x->exp_avg(), x->exp_avg_sq(), x->max_exp_avg_sq()};
  if (auto* x = dynamic_cast<const optim::AdamWParamState*>(&s))
    return {x->exp_avg(), x->exp_avg_sq(), x->max_exp_avg_sq()};
  if (auto* x = dynamic_cast<const optim::AdagradParamState*>(&s)) return {x->sum()};
  if (auto* x = dynamic_cast<const optim::RMSpropParamState*>(&s))
    return {x->square_avg(), x->momentum_buffer(), x->grad_avg()};
  throw InvalidArgument(fmt::format("ZeroRedundancyOptimizer: cannot cut optimizer state of type {}",
                                    typeid(s).name()));
}

void set_tensors(optim::OptimizerParamState& s, const std::vector<Tensor>& t) {
  if (auto* x = dynamic_cast<optim::SGDParamState*>(&s)) {
    x->momentum_buffer(t[0]);
  } else if (auto* x = dynamic_cast<optim::AdamParamState*>(&s)) {
    x->exp_avg(t[0]).exp_avg_sq(t[1]).max_exp_avg_sq(t[2]);
  } else if (auto* x = dynamic_cast<optim::AdamWParamState*>(&s)) {
    x->exp_avg(t[0]).exp_avg_sq(t[1]).max_exp_avg_sq(t[2]);
  } else if (auto* x = dynamic_cast<optim::AdagradParamState*>(&s)) {
    x->sum(t[0]);
  } else if (auto* x = dynamic_cast<optim::RMSpropParamState*>(&s)) {
    x->square_avg(t[0]).momentum_buffer(t[1]).grad_avg(t[2]);
  }
}

}  // namespace

std::int64_t balanced_chunk(std::int64_t total, int ranks) {
  return std::max<std::int64_t>(1, (total + ranks - 1) / ranks);
}

std::vector<Piece> partition_balanced(const std::vector<std::int64_t>& numels, int ranks) {
  std::int64_t total = 0;
  for (const auto n : numels) total += n;
  const std::int64_t chunk = balanced_chunk(total, ranks);
  const auto rank_at = [&](std::int64_t position) {
    return static_cast<int>(std::min<std::int64_t>(position / chunk, ranks - 1));
  };
  std::vector<Piece> pieces;
  std::int64_t position = 0;  // of the tensor's first element, end to end
  for (std::size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] == 0) pieces.push_back({i, 0, 0, rank_at(position)});
    for (std::int64_t begin = 0; begin < numels[i];) {
      const int owner = rank_at(position + begin);
      const std::int64_t rank_end = owner == ranks - 1 ? total : (owner + 1) * chunk;
      const std::int64_t count = std::min(numels[i] - begin, rank_end - (position + begin));
      pieces.push_back({i, begin, count, owner});
      begin += count;
    }
    position += numels[i];
  }
  return pieces;
}

bool steps_elementwise(const optim::Optimizer& optimizer) {
  const std::type_info& type = typeid(optimizer);
  return type == typeid(optim::SGD) || type == typeid(optim::Adam) || type == typeid(optim::AdamW) ||
         type == typeid(optim::Adagrad) || type == typeid(optim::RMSprop);
}

std::unique_ptr<optim::Optimizer> same_type(const optim::Optimizer& like, std::vector<optim::OptimizerParamGroup> groups) {
  const std::type_info& type = typeid(like);
  const auto& d = like.defaults();
  if (type == typeid(optim::SGD)) return std::make_unique<optim::SGD>(groups, static_cast<const optim::SGDOptions&>(d));
  if (type == typeid(optim::Adam))
    return std::make_unique<optim::Adam>(groups, static_cast<const optim::AdamOptions&>(d));
  if (type == typeid(optim::AdamW))
    return std::make_unique<optim::AdamW>(groups, static_cast<const optim::AdamWOptions&>(d));
  if (type == typeid(optim::Adagrad))
    return std::make_unique<optim::Adagrad>(groups, static_cast<const optim::AdagradOptions&>(d));
  return std::make_unique<optim::RMSprop>(groups, static_cast<const optim::RMSpropOptions&>(d));
}

void copy_options(const std::vector<optim::OptimizerParamGroup>& from, std::vector<optim::OptimizerParamGroup>& to) {
  for (std::size_t g = 0; g < from.size() && g < to.size(); ++g) to[g].set_options(from[g].options().clone());
}

std::unique_ptr<optim::OptimizerParamState> slice_state(const optim::OptimizerParamState& whole, std::int64_t begin,
                                                       std::int64_t count) {
  auto piece = whole.clone();
  auto tensors = tensors_of(whole);
  for (auto& t : tensors)
    if (t.defined()) t = t.reshape({-1}).narrow(0, begin, count).clone();
  set_tensors(*piece, tensors);
  return piece;
}

std::unique_ptr<optim::OptimizerParamState> merge_states(const std::vector<const optim::OptimizerParamState*>& pieces,
                                                        c10::IntArrayRef sizes) {
  auto whole = pieces.at(0)->clone();
  std::vector<std::vector<Tensor>> fields;  // [piece][entry]
  for (const auto* p : pieces) fields.push_back(tensors_of(*p));
  std::vector<Tensor> merged(fields[0].size());
  for (std::size_t e = 0; e < merged.size(); ++e) {
    if (!fields[0][e].defined()) continue;
    std::vector<Tensor> parts;
    for (const auto& f : fields) parts.push_back(f[e].reshape({-1}));
    merged[e] = ::torch::cat(parts).reshape(sizes);
  }
  set_tensors(*whole, merged);
  return whole;
}

}  // namespace lockstep::torch::zero_pieces
