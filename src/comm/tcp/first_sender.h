// The tcp backend's wait behind a recv from any source: which peer's
// connection has a point-to-point message to this rank at its head.
//
// A connection carries one peer's bytes in the order it sent them, so the
// only message that can be taken from a peer is the one at the head of its
// stream, and taking it (the named-source recv, header check included)
// keeps that peer's order. The wait peeks (MSG_PEEK) at the head's first
// bytes and consumes nothing. A head that is not a message means that peer
// cannot send one before this recv ends: its goodbye (it left the group),
// or a collective's stamp (it went on to a collective, which needs this
// rank, which is here). Such peers are not looked at again in this wait.
//
// Not thread-safe: runs on the group's progress thread.
#pragma once

#include "comm/backend.h"
#include "comm/tcp/mesh.h"

namespace lockstep {

// The first peer found with a message at the head of its connection,
// looking at the ranks after `after` first, so that one busy sender does not
// starve the others. Waits until op's deadline; throws TimeoutError then,
// OperationCancelled when the group aborts, PeerError when a peer's
// connection breaks or every peer has left, and MismatchError when every
// peer still in the group went on to a collective.
int first_sender(Mesh& mesh, const OpContext& op, int after);

}  // namespace lockstep
