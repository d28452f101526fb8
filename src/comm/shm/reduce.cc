// shm reduce: the root reduces everyone's input for small buffers; large
// ones take the two-shot path where every rank reduces the chunk it owns and
// only the root gathers. Non-root buffers are left unchanged. On the small
// path each other rank checks the root's stamp (waiting for its arrival):
// ranks that name different roots would otherwise each hand their input to
// a root that never reads it.
#include <cstring>

#include "comm/reduce_kernels.h"
#include "comm/shm/shm_backend.h"

namespace lockstep::shm {

void ShmBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  if (size_ == 1 || data.count == 0) return;
  if (data.bytes() > one_shot_max_) {
    reduce_two_shot(op, data, reduce_op, root);
    return;
  }
  const std::uint64_t g = begin_round(op);
  to_slot(slot(rank_, g), data.data, data.bytes());
  post_arrive(g, op);
  if (rank_ == root) {
    wait_arrived_all(g, op, "its input");
    for (int q = 0; q < size_; ++q) sources_[static_cast<std::size_t>(q)] = q == rank_ ? data.data : slot(q, g);
    reduce_many(data.data, sources_.data(), size_, data.count, data.dtype, reduce_op);
  } else {
    wait_arrived(root, g, op, "the root's arrival at the reduce");
  }
  control(rank_).consumed.post(g + 1);
}

}  // namespace lockstep::shm
