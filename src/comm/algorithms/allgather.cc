// allgather: place this rank's input in its slot, then one ring allgather
// pass (each rank sends (n-1)/n of the output, the minimum).
#include <cstring>

#include "comm/algorithms/collectives.h"
#include "comm/algorithms/ring.h"

namespace lockstep {

void TransportCollectives::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  const int n = transport_.size();
  const std::size_t elem = dtype_size(input.dtype);
  auto* slot = static_cast<std::byte*>(output.data) + static_cast<std::size_t>(transport_.rank()) * input.count * elem;
  if (input.bytes() > 0 && slot != input.data) std::memmove(slot, input.data, input.bytes());
  if (n == 1 || input.count == 0) return;
  ring_allgather(transport_, op, output.data, elem, Chunks(input.count * static_cast<std::size_t>(n), n));
}

}  // namespace lockstep
