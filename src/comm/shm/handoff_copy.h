// Copies into memory that a peer on another core reads next: the shared
// slots and mailboxes of the ordinary-buffer path.
//
// An ordinary store leaves each line modified in this core's cache, so the
// peer's read of it is a cache-to-cache transfer. How fast that is depends
// on where the host put the two cores: on a virtual machine of an AMD EPYC
// host (docs/performance.md, "The ordinary path's slow mode") a line's
// round trip between cores of one die took 76-91 ns and a 128 KiB chunk
// was handed over at 6.6-7.3 GB/s; when the host moved the vCPUs onto
// different dies (for tens of seconds at a time), 335-360 ns and 1.7-1.9
// GB/s, and a 96 MiB all-reduce took 4x as long. Non-temporal stores write
// the lines to memory instead, and the peer reads them from there: 4.4-7.0
// GB/s in either placement (bench/core_to_core). Small copies keep ordinary
// stores: the peer reads them at once, and memory latency would cost more
// than the transfer.
//
// Stateless; thread-safe.
#pragma once

#include <cstddef>

namespace lockstep::shm {

// Copies `bytes` from `src` to `dst`, with non-temporal stores when `bytes`
// is at least `streaming_from` (0: never). The stores are fenced before it
// returns, so a release store that follows (posting the round) is seen
// after them, as after a memcpy.
void copy_for_peer(void* dst, const void* src, std::size_t bytes, std::size_t streaming_from);

}  // namespace lockstep::shm
