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
// shrink) need not wait for it. `incarnation`: which start of the rank in
// the round ended (0: the first; a replacement started after a death,
// --max-replacements, counts up), so that a replacement is not taken for
// the process it replaced.
inline std::string launcher_lost_key(int round, int rank, int incarnation = 0) {
  return incarnation == 0 ? fmt::format("launcher/{}/lost/{}", round, rank)
                          : fmt::format("launcher/{}/lost/{}.{}", round, rank, incarnation);
}

// Set by a launcher whose peers saw its node lost (it stopped beating):
// every start of global rank `rank` of round `round` up to the one the
// value names (launcher_starts_key's count when the node was lost) has
// ended. A node that takes the lost one's place starts later ones.
inline std::string launcher_node_lost_key(int round, int rank) {
  return fmt::format("launcher/{}/node_lost/{}", round, rank);
}

// A counter: the latest start of global rank `rank` in round `round` (0,
// absent: only the first). Every launcher that starts the rank again (a
// replacement, a node taking a lost one's place) takes the next number
// here, so that no two processes of a rank share one, whichever node
// started them.
inline std::string launcher_starts_key(int round, int rank) {
  return fmt::format("launcher/{}/starts/{}", round, rank);
}

// Set by a replacement (start `incarnation` > 0 of global rank `rank`) once
// it joined the running group: the launcher counts it among the ranks that
// went on, where one that ended before it joined (the job had finished)
// does not.
inline std::string launcher_joined_key(int round, int rank, int incarnation) {
  return fmt::format("launcher/{}/joined/{}.{}", round, rank, incarnation);
}

// Set by a rank whose group re-formed without global rank `rank` of round
// `round` while it was neither heard from nor known to have ended (frozen,
// or cut off from its peers): the rank's launcher kills it if it still
// runs, so that it neither holds up the job's end nor wakes into a job
// that went on without it.
inline std::string launcher_dropped_key(int round, int rank, int incarnation = 0) {
  return incarnation == 0 ? fmt::format("launcher/{}/dropped/{}", round, rank)
                          : fmt::format("launcher/{}/dropped/{}.{}", round, rank, incarnation);
}

}  // namespace lockstep
