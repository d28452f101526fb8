// The start-up handshake of a group, through its store: each rank claims its
// rank number, the ranks agree on the world size, and each publishes its
// host identity (hostname + boot id), which later decides which ranks share
// memory. A rank that finds a disagreement records it in the store, so every
// other rank fails with the same explanation within a second instead of
// waiting for its timeout.
// Thread-safe as long as the store is.
#pragma once

#include <string>
#include <vector>

#include "common/os.h"
#include "lockstep/store.h"
#include "lockstep/types.h"

namespace lockstep {

// This host's identity: "hostname/boot-id". Two processes share memory only
// if their identities are equal.
std::string host_identity();

// Returns every rank's host identity, indexed by rank. `host_id`, when not
// empty, is published in place of host_identity(): ranks on one machine can
// then pose as several hosts (tests of hier), or ranks in containers that
// share memory can say so. `timeout` is measured on `clock` (the group's
// Os).
std::vector<std::string> rendezvous(Store& store, int rank, int world_size, Duration timeout,
                                    const std::string& host_id = {}, Os& clock = Os::real());

// new_group's check before its rendezvous: every member (`world_rank`, one
// of `ranks`) publishes the list it passed under `key` and compares the
// others'. The order numbers the new group's ranks, so members that list
// the same ranks in different orders would claim the same numbers: a
// MismatchError naming both lists, on every member. A member that never
// calls it is a TimeoutError after `timeout` naming it.
void agree_on_member_order(Store& store, const std::string& key, const std::vector<int>& ranks, int world_rank,
                           Duration timeout);

}  // namespace lockstep
