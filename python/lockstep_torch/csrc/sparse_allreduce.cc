// sparse_all_reduce_sum (see sparse_allreduce.h).
#include "sparse_allreduce.h"

#include <algorithm>

#include "lockstep/torch/distributed.h"

namespace lockstep_torch {
namespace {

namespace dist = lockstep::torch;

// `part` (rows of a sparse tensor's indices or values along `dim`, `count`
// of them) padded with zeros to `padded` rows, so every rank contributes
// the same size to the all-gather.
at::Tensor padded_to(const at::Tensor& part, int64_t dim, int64_t padded) {
  auto shape = part.sizes().vec();
  shape[static_cast<std::size_t>(dim)] = padded;
  at::Tensor out = at::zeros(shape, part.options());
  out.narrow(dim, 0, part.size(dim)).copy_(part);
  return out;
}

// Every rank's `part` padded to `padded` rows along `dim`, gathered; then
// the first counts[r] rows of rank r's, concatenated in rank order.
at::Tensor gather_parts(lockstep::ProcessGroup& group, const at::Tensor& part, int64_t dim, int64_t padded,
                        const std::vector<int64_t>& counts) {
  // all_gather_into_tensor stacks along dimension 0: gather with `dim`
  // moved there, then move it back.
  const at::Tensor local = padded_to(part, dim, padded).movedim(dim, 0).contiguous();
  auto shape = local.sizes().vec();
  shape[0] *= group.size();
  const at::Tensor all = at::empty(shape, local.options());
  dist::all_gather_into_tensor(group, all, local);
  std::vector<at::Tensor> kept;
  for (std::size_t r = 0; r < counts.size(); ++r)
    kept.push_back(all.narrow(0, static_cast<int64_t>(r) * padded, counts[r]));
  return at::cat(kept, 0).movedim(0, dim);
}

}  // namespace

at::Tensor sparse_all_reduce_sum(lockstep::ProcessGroup& group, const at::Tensor& input) {
  const at::Tensor local = input.coalesce();
  const at::Tensor count = at::full({1}, local._nnz(), at::kLong);
  const at::Tensor all_counts = at::empty({group.size()}, at::kLong);
  dist::all_gather_into_tensor(group, all_counts, count);
  const std::vector<int64_t> counts(all_counts.data_ptr<int64_t>(), all_counts.data_ptr<int64_t>() + group.size());
  const int64_t padded = *std::max_element(counts.begin(), counts.end());

  const at::Tensor indices = gather_parts(group, local._indices(), 1, padded, counts);
  const at::Tensor values = gather_parts(group, local._values(), 0, padded, counts);
  // coalesce() adds the entries that share an index; every rank adds the
  // same parts in the same order.
  return at::sparse_coo_tensor(indices, values, input.sizes(), input.options()).coalesce();
}

}  // namespace lockstep_torch
