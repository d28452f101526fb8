// Collectives over serialised objects of any size (torch.distributed's
// all_gather_object, broadcast_object_list, gather_object), on bytes: the
// caller serialises its objects to bytes however it likes (for libtorch's
// archives see lockstep/torch/distributed.h), and each function first
// exchanges the sizes, then the bytes. Blocking; every rank of the group
// calls them in the same order, like any collective.
//
//   std::vector<std::byte> mine = serialise(my_metrics);
//   auto everyone = lockstep::all_gather_object(*pg, mine);   // everyone[r]: rank r's bytes
//
// Thread-safety: as the group's collectives (process_group.h).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "lockstep/process_group.h"

namespace lockstep {

using Bytes = std::vector<std::byte>;

// Every rank receives every rank's bytes, in rank order.
std::vector<Bytes> all_gather_object(ProcessGroup& group, const Bytes& object);
// Root receives every rank's bytes in rank order; other ranks get an empty list.
std::vector<Bytes> gather_object(ProcessGroup& group, const Bytes& object, int root);
// Every rank's `objects` becomes root's list (its length included).
void broadcast_object_list(ProcessGroup& group, std::vector<Bytes>& objects, int root);

// Bytes of a string and back, for objects that serialise to text.
Bytes to_bytes(std::string_view text);
std::string to_string(const Bytes& bytes);

}  // namespace lockstep
