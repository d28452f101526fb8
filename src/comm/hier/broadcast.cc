// hier broadcast: the root's data crosses to every host once, along the
// ring of the ranks that share the root's local rank (tree or chain by
// size, the shared algorithms over the tcp mesh), then each host's copy is
// broadcast inside the host over shm from that local rank.
#include <algorithm>

#include "comm/algorithms/broadcast.h"
#include "comm/algorithms/root_agreement.h"
#include "comm/hier/hier_backend.h"

namespace lockstep {

void HierBackend::broadcast(const OpContext& op, Buffer data, int root) {
  if (!hierarchical()) return flat_.broadcast(op, data, root);
  if (data.count == 0) return;
  // Which ranks cross hosts depends on the root: agree on it first.
  check_root_agreement(flat_.transport(), op);
  const int root_local = layout_.local_rank_of[static_cast<std::size_t>(root)];
  if (layout_.local_rank == root_local) {
    const auto& across = layout_.across;
    const int root_index = static_cast<int>(std::find(across.begin(), across.end(), root) - across.begin());
    if (data.bytes() <= flat_.small_bytes())
      broadcast_tree(*across_, op, data.data, data.bytes(), root_index);
    else
      broadcast_chain(*across_, op, data.data, data.bytes(), root_index);
  }
  if (local_) local_->broadcast(op, data, root_local);
}

}  // namespace lockstep
