// hier backend construction, shutdown and factory; the hierarchical
// collectives have a file each beside this one, the rest are forwarded to
// the flat tcp backend (ForwardingBackend).
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
    : ForwardingBackend(flat_), size_(ctx.size), layout_(ctx.host_ids, ctx.rank), flat_(ctx) {
  if (layout_.local_size() > 1) local_ = make_shm_backend(local_context(ctx, layout_));
  if (layout_.uniform) {
    across_.emplace(flat_.transport(), layout_.across);
    across_collectives_.emplace(*across_, flat_.small_bytes());
  }
}

void HierBackend::shutdown(Deadline deadline) {
  if (local_) local_->shutdown(deadline);
  flat_.shutdown(deadline);
}

std::unique_ptr<Backend> make_hier_backend(const BackendContext& ctx) { return std::make_unique<HierBackend>(ctx); }

}  // namespace lockstep
