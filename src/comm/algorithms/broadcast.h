// Broadcast over any Transport: a binomial tree for small messages
// (ceil(log2 n) rounds) and a pipelined chain for large ones (each rank
// forwards bytes as they arrive, so the time approaches one buffer transfer
// plus n-1 socket reads). Used by the tcp backend and by hier across hosts.
//
// Not thread-safe: runs on the progress thread.
#pragma once

#include <cstddef>

#include "comm/transport.h"

namespace lockstep {

void broadcast_tree(Transport& transport, const OpContext& op, void* data, std::size_t bytes, int root);
void broadcast_chain(Transport& transport, const OpContext& op, void* data, std::size_t bytes, int root);

}  // namespace lockstep
