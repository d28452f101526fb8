// Where the ranks of a group sit, by host: which ranks share this rank's
// host, this rank's index among them (its local rank), and the ranks with
// the same local rank on the other hosts (its cross-host peers). A pure
// function of the rendezvous' host identities, so every rank computes the
// same layout. A value; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace lockstep {

struct HostLayout {
  HostLayout(const std::vector<std::string>& host_ids, int rank);

  int hosts = 0;                   // distinct hosts, numbered by their lowest rank
  int host = 0;                    // this rank's host
  int local_rank = 0;              // index among the ranks of this host (by rank)
  std::vector<int> host_of;        // per group rank: its host
  std::vector<int> local_rank_of;  // per group rank: its local rank
  std::vector<int> local_ranks;    // group ranks on this host, ascending
  // Group ranks with this rank's local rank, one per host that has one, in
  // rank order (this rank among them).
  std::vector<int> across;
  // Every host runs the same number of ranks: the hierarchical algorithms
  // apply (otherwise hier falls back to its flat tcp mesh).
  bool uniform = true;
  // Uniform layouts only: every group rank, ordered by local rank and then
  // by rank (entry l * hosts + i is the i-th rank of local rank l): where
  // each rank's block lies after a cross-host step among the ranks of each
  // local rank and a step inside the host (hier's allgather and
  // reduce_scatter).
  std::vector<int> by_local_rank;

  int local_size() const { return static_cast<int>(local_ranks.size()); }
};

}  // namespace lockstep
