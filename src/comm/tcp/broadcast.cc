// tcp broadcast: binomial tree for small messages, a pipelined chain for
// large ones (algorithms/broadcast.h), over the mesh.
#include "comm/algorithms/broadcast.h"
#include "comm/tcp/tcp_backend.h"

namespace lockstep {

void TcpBackend::broadcast(const OpContext& op, Buffer data, int root) {
  if (mesh_.size() == 1 || data.count == 0) return;
  check_agreement_around_the_ring(op);
  if (data.bytes() <= small_bytes_)
    broadcast_tree(mesh_, op, data.data, data.bytes(), root);
  else
    broadcast_chain(mesh_, op, data.data, data.bytes(), root);
}

}  // namespace lockstep
