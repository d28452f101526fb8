// hier allgather, in two steps:
//   1. across hosts: the ranks with this rank's local rank gather their
//      inputs (the shared ring allgather over the cross-host ring), into
//      this local rank's row of a scratch table (local rank x host);
//   2. inside the host: an shm allgather of the rows fills the table;
//   then every block is copied to its rank's place in the output.
// Each host sends its ranks' inputs across the wire once to each other
// host: (hosts - 1) x local size blocks per host, where the flat ring over
// every rank carries (ranks - 1) blocks over each host boundary (1.5x more
// at 2 hosts x 2 ranks; docs/algorithms.md).
#include <cstring>

#include "comm/hier/hier_backend.h"

namespace lockstep {

void HierBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  if (!hierarchical() || !local_ || input.count == 0) return flat_.allgather(op, input, output);
  const auto hosts = static_cast<std::size_t>(layout_.hosts);
  const auto local_size = static_cast<std::size_t>(layout_.local_size());
  const std::size_t block = input.bytes();
  std::byte* table = gathered_.get(hosts * local_size * block);
  std::byte* own_row = table + static_cast<std::size_t>(layout_.local_rank) * hosts * block;
  across_collectives_->allgather(op, input, Buffer{own_row, hosts * input.count, input.dtype});
  local_->allgather(op, ConstBuffer(own_row, hosts * input.count, input.dtype),
                    Buffer{table, local_size * hosts * input.count, input.dtype});
  auto* out = static_cast<std::byte*>(output.data);
  for (std::size_t i = 0; i < layout_.by_local_rank.size(); ++i)
    std::memcpy(out + static_cast<std::size_t>(layout_.by_local_rank[i]) * block, table + i * block, block);
}

}  // namespace lockstep
