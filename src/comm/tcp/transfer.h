// The tcp backend's data pump, behind Mesh::transfer (the Transport
// interface, comm/transport.h): run_transfer moves bytes on all of an
// algorithm's channels at once with non-blocking sockets and poll(2) until
// every source is drained and every sink is full.
//
// Sources may produce bytes progressively (a ring forwards what it has just
// reduced), and sinks may consume them progressively (reduce each piece as it
// lands), which is how pipelining happens: there are no explicit segments,
// the kernel's socket buffers hold the data in flight.
//
// While waiting, run_transfer also watches every other peer's connection for
// a hang-up, so the death of any rank is reported within milliseconds as a
// PeerError naming it; a wait past the operation's deadline is a
// TimeoutError naming the peer waited for.
//
// Not thread-safe: runs on the group's progress thread.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "comm/backend.h"
#include "comm/tcp/mesh.h"
#include "comm/transport.h"

namespace lockstep {

void run_transfer(Mesh& mesh, const OpContext& op, std::span<const Channel> channels);

// How often a poll that waits for peers wakes to see whether the group
// aborted meanwhile (another rank failed): then the operation is
// cancelled, not left to its deadline.
inline constexpr int kCancelCheckMs = 50;

// The PeerError for a peer whose connection broke (`how`), or that left
// the group on purpose if it said goodbye.
PeerError lost_peer(const Mesh& mesh, const OpContext& op, int peer, const std::string& how);

}  // namespace lockstep
