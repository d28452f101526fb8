// sparse_all_reduce_sum (see sparse_allreduce.h).
#include "sparse_allreduce.h"

#include "lockstep/torch/distributed.h"

namespace lockstep_torch {
namespace {

namespace dist = lockstep::torch;

// Every rank's `part` (a sparse tensor's indices or values: counts[r] of
// them along `dim` on rank r) in rank order: the all-gather with per-rank
// sizes, each rank's part received into a tensor of its own shape.
at::Tensor gather_parts(lockstep::ProcessGroup& group, const at::Tensor& part, int64_t dim,
                        const std::vector<int64_t>& counts) {
  std::vector<at::Tensor> parts;
  for (const int64_t count : counts) {
    auto shape = part.sizes().vec();
    shape[static_cast<std::size_t>(dim)] = count;
    parts.push_back(at::empty(shape, part.options()));
  }
  dist::all_gather(group, parts, part.contiguous());
  return at::cat(parts, dim);
}

}  // namespace

at::Tensor sparse_all_reduce_sum(lockstep::ProcessGroup& group, const at::Tensor& input) {
  const at::Tensor local = input.coalesce();
  const at::Tensor count = at::full({1}, local._nnz(), at::kLong);
  const at::Tensor all_counts = at::empty({group.size()}, at::kLong);
  dist::all_gather_into_tensor(group, all_counts, count);
  const std::vector<int64_t> counts(all_counts.data_ptr<int64_t>(), all_counts.data_ptr<int64_t>() + group.size());

  const at::Tensor indices = gather_parts(group, local._indices(), 1, counts);
  const at::Tensor values = gather_parts(group, local._values(), 0, counts);
  // coalesce() adds the entries that share an index; every rank adds the
  // same parts in the same order.
  return at::sparse_coo_tensor(indices, values, input.sizes(), input.options()).coalesce();
}

}  // namespace lockstep_torch
