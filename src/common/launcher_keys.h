// Keys `lockstep run`'s launchers and their ranks share in the launcher's
// store, for what one side tells the other during a round. Pure; thread-safe.
#pragma once

#include <string>

#include <fmt/format.h>

namespace lockstep {

// Set by a launcher, with its reason, before it stops the ranks of round
// `round` on purpose (to re-form the group with a node that joins): a rank
// that then sees a peer go reports the planned stop, not a failure.
inline std::string launcher_stop_key(int round) { return fmt::format("launcher/{}/stopping", round); }

// Set by a launcher that lets a job go on without a rank (--on-rank-failure
// continue) once that rank of round `round`, by its global rank, has ended
// while the others run: survivors re-forming their group (ProcessGroup::
// shrink) need not wait for it.
inline std::string launcher_lost_key(int round, int rank) { return fmt::format("launcher/{}/lost/{}", round, rank); }

// Set by a rank whose group re-formed without global rank `rank` of round
// `round` while it was neither heard from nor known to have ended (frozen,
// or cut off from its peers): the rank's launcher kills it if it still
// runs, so that it neither holds up the job's end nor wakes into a job
// that went on without it.
inline std::string launcher_dropped_key(int round, int rank) {
  return fmt::format("launcher/{}/dropped/{}", round, rank);
}

}  // namespace lockstep
