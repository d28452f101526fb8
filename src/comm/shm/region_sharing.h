// Every rank's copy of one shared object (the group's regions, a shared
// allocation), created by each rank and mapped by all, agreed through the
// store:
//   1. each rank creates its copy without a name (region.h) and publishes
//      the descriptor peers open it through;
//   2. each rank opens every peer's copy through /proc/<pid>/fd and
//      publishes whether it could;
//   3. if every rank could, each closes its descriptor: nothing ever had a
//      name. Otherwise every rank drops what it made and creates its copy
//      again under a name, maps its peers' by name, and unlinks its own
//      once every rank says it has mapped them (the window in which a
//      killed rank leaves a file; the launcher and the sweep remove it).
// Every rank takes the same branch, decided from every rank's answer.
// Not thread-safe: one sharing at a time per store prefix.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/os.h"
#include "comm/shm/region.h"
#include "lockstep/store.h"

namespace lockstep::shm {

struct RegionSharing {
  Store* store = nullptr;
  int rank = 0;
  int size = 0;
  std::vector<pid_t> pids;  // every rank's, as published at set-up
  std::string stem;         // this rank's segment stem, for a named copy
  Duration timeout{};       // for peers to map a named copy
  Os* os = nullptr;
};

struct SharedRegions {
  std::vector<Region> regions;  // regions[q]: rank q's copy, own included
  std::string why_named;        // "" when no copy had a name; else why (the first rank's reason)
};

// Shares this rank's copy of `bytes` under `key` (a store prefix of its
// own) and maps every peer's. `what` names a named copy
// ("/lockstep.<stem>.<what>.<pid>"). `init` fills this rank's copy before
// any peer can see it (called again for a named copy).
SharedRegions share_regions(const RegionSharing& how, const std::string& key, const std::string& what,
                            std::size_t bytes, const std::function<void(std::byte*)>& init);

}  // namespace lockstep::shm
