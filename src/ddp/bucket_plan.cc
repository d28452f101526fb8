// Bucket planning: a pure function of the parameter list, the visiting
// order and the size limits; see plan_buckets in lockstep/reducer.h.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "lockstep/error.h"
#include "lockstep/reducer.h"

namespace lockstep {

std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

std::vector<Bucket> plan_buckets(const std::vector<ParamSpec>& params, const std::vector<std::size_t>& order,
                                 const BucketPlanOptions& options) {
  std::vector<bool> seen(params.size(), false);
  if (order.size() != params.size())
    throw InvalidArgument(fmt::format("plan_buckets: the order lists {} parameters, the model has {}", order.size(),
                                      params.size()));
  for (std::size_t i : order) {
    if (i >= params.size() || seen[i])
      throw InvalidArgument(fmt::format("plan_buckets: the order is not a permutation (index {})", i));
    seen[i] = true;
  }

  struct Open {
    Bucket bucket;
    std::size_t first_position = 0;
  };
  std::map<DType, Open> open;         // the bucket being filled, per dtype
  std::map<DType, bool> had_first;    // whether the dtype's first (small) bucket is done
  std::vector<std::pair<std::size_t, Bucket>> closed;  // (first position, bucket)
  const auto close = [&](DType t) {
    Open& o = open[t];
    closed.emplace_back(o.first_position, std::move(o.bucket));
    open.erase(t);
    had_first[t] = true;
  };
  for (std::size_t position = 0; position < order.size(); ++position) {
    const ParamSpec& p = params[order[position]];
    Open& o = open[p.dtype];
    if (o.bucket.params.empty()) {
      o.first_position = position;
      o.bucket.dtype = p.dtype;
    }
    o.bucket.params.push_back(order[position]);
    o.bucket.offsets.push_back(o.bucket.count);
    o.bucket.count += p.count;
    // The cap bounds the first bucket too: a cap below the first bucket's
    // size (bucket_cap_mb = 0.01) gives small buckets from the start.
    const std::size_t limit =
        had_first[p.dtype] ? options.bucket_cap_bytes : std::min(options.first_bucket_bytes, options.bucket_cap_bytes);
    if (o.bucket.bytes() >= limit) close(p.dtype);
  }
  while (!open.empty()) close(open.begin()->first);
  std::stable_sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Bucket> out;
  out.reserve(closed.size());
  for (auto& c : closed) out.push_back(std::move(c.second));
  return out;
}

}  // namespace lockstep
