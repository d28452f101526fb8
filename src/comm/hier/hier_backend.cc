// hier backend construction, shutdown, factory, and the collectives that
// run on the flat tcp mesh; allreduce.cc and broadcast.cc hold the
// hierarchical ones.
#include "comm/hier/hier_backend.h"

#include <fmt/format.h>

namespace lockstep {
namespace {

// The context of the shm backend over this host's ranks: its own store
// prefix and group key, so hosts do not meet in each other's keys.
BackendContext local_context(const BackendContext& ctx, const HostLayout& layout) {
  BackendContext local = ctx;
  local.rank = layout.local_rank;
  local.size = layout.local_size();
  local.world = false;
  local.store = std::make_shared<PrefixStore>(fmt::format("hier/host/{}", layout.host), ctx.store);
  local.group_key = fmt::format("{}/hier/host/{}", ctx.group_key, layout.host);
  local.host_ids.clear();
  for (int r : layout.local_ranks) local.host_ids.push_back(ctx.host_ids[static_cast<std::size_t>(r)]);
  return local;
}

}  // namespace

// Every rank connects the full mesh first, then its host's shared memory:
// the same order everywhere, so neither waits on a peer busy with the other.
HierBackend::HierBackend(const BackendContext& ctx)
    : size_(ctx.size), layout_(ctx.host_ids, ctx.rank), flat_(ctx) {
  if (layout_.local_size() > 1) local_ = make_shm_backend(local_context(ctx, layout_));
  if (layout_.uniform) across_.emplace(flat_.transport(), layout_.across);
}

void HierBackend::shutdown(Deadline deadline) {
  if (local_) local_->shutdown(deadline);
  flat_.shutdown(deadline);
}

void HierBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  flat_.allgather(op, input, output);
}
void HierBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  flat_.reduce_scatter(op, input, output, reduce_op);
}
void HierBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  flat_.reduce(op, data, root, reduce_op);
}
void HierBackend::barrier(const OpContext& op) { flat_.barrier(op); }
void HierBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  flat_.gather(op, input, output, root);
}
void HierBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  flat_.scatter(op, input, output, root);
}
void HierBackend::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  flat_.all_to_all(op, input, output, counts);
}
void HierBackend::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                              const std::vector<std::size_t>& counts) {
  flat_.allgather_v(op, input, output, counts);
}
void HierBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) { flat_.send(op, data, dst, tag); }
void HierBackend::recv(const OpContext& op, Buffer data, int src, int tag) { flat_.recv(op, data, src, tag); }

std::unique_ptr<Backend> make_hier_backend(const BackendContext& ctx) { return std::make_unique<HierBackend>(ctx); }

}  // namespace lockstep
