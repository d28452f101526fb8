// A map of logical shards to the ranks that hold them (holder[s]: the rank
// of shard s), as the collectives over logical shards take it
// (ProcessGroup::reduce_shards, allgather_shards, reduce_scatter_shards)
// and the logical shards of a job that survives a rank's death deal it
// (ddp/logical_shards.h). Pure; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lockstep/types.h"

namespace lockstep {

// The shards `rank` holds, ascending.
inline std::vector<int> shards_held(const std::vector<int>& holder, int rank) {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(holder.size()); ++s)
    if (holder[static_cast<std::size_t>(s)] == rank) out.push_back(s);
  return out;
}

// How many shards each of `size` ranks holds.
inline std::vector<std::size_t> shards_per_rank(const std::vector<int>& holder, int size) {
  std::vector<std::size_t> out(static_cast<std::size_t>(size), 0);
  for (int q : holder) ++out[static_cast<std::size_t>(q)];
  return out;
}

// Where each rank's shards start when every rank's are laid end to end in
// rank order (each rank's in its shard order): the layout the exchanges of
// the collectives over shards deliver.
inline std::vector<std::size_t> first_shard_of_rank(const std::vector<std::size_t>& per_rank) {
  std::vector<std::size_t> out;
  out.reserve(per_rank.size());
  std::size_t at = 0;
  for (std::size_t k : per_rank) {
    out.push_back(at);
    at += k;
  }
  return out;
}

// Whether rank s holds shard s, and nothing else, in a group of `size`.
inline bool each_rank_holds_its_own(const std::vector<int>& holder, int size) {
  if (static_cast<int>(holder.size()) != size) return false;
  for (int s = 0; s < size; ++s)
    if (holder[static_cast<std::size_t>(s)] != s) return false;
  return true;
}

// A digest of the map, carried in an operation's stamp: ranks that
// disagree on who holds what, or a rank that issued a plain collective of
// the same length, fail the stamp check instead of exchanging garbage.
inline std::uint64_t holders_digest(const std::vector<int>& holder) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ holder.size();
  for (int q : holder) h = (h ^ static_cast<std::uint64_t>(q + 1)) * 0x100000001b3ull;
  return h == 0 ? 1 : h;
}

// InvalidArgument, naming the shard or the count, unless every holder of
// `holder` is a rank of a group of `size` and `rank` holds as many shards
// as `passed` (the buffers it gave), for collective `op`. Defined in
// shard_reduction.cc.
void check_shard_map(const char* op, const std::vector<int>& holder, int size, int rank, std::size_t passed);
// InvalidArgument unless `reduction` folds (sum, avg, min, max, prod), for
// collective `op`. Defined in shard_reduction.cc.
void check_fold_over_shards(const char* op, ReduceOp reduction);

}  // namespace lockstep
