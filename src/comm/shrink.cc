// ProcessGroup::shrink: the group re-formed in place among the ranks still
// here (process_group.h has the contract). Attempt k of a failed group
// agrees through the group's store, under "shrink/<k>/":
//   here/<r>   rank r is here and goes on (set once it called shrink);
//   members    the first proposal stored (compare_set), which every rank
//              adopts: the members of the new group and the ranks its
//              proposer knew to have ended, "<members>|<ended>".
// A rank waits until every rank not known to be gone has said it is here,
// or `window` passes, then proposes those here (ascending). The majority
// rule counts the ended ranks of the adopted proposal, not each rank's own
// reading: a rank whose last reading came just before the launcher wrote an
// end, and that found the proposal stored just after, would otherwise stop
// for want of a majority while the others go on with it as a member. The new group's
// key is "<this group's key>/shrunk/<k>": its own store keys, its own
// rendezvous, new connections and shared memory among the members only.
// The failed group stays as it was; the caller destroys it when it likes.
#include <algorithm>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/group_impl.h"
#include "common/launcher_keys.h"
#include "common/enforce.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

std::string encode(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, " ")); }

std::vector<int> decode(const std::string& text) {
  std::vector<int> out;
  std::istringstream in(text);
  for (int r = 0; in >> r;) out.push_back(r);
  return out;
}

// What the ranks agree on: who goes on, and who was known to have ended
// when that was proposed (what the majority is counted against).
struct Proposal {
  std::vector<int> members;
  std::set<int> ended;
};

std::string encode(const Proposal& p) {
  return fmt::format("{}|{}", encode(p.members), fmt::join(p.ended, " "));
}

Proposal decode_proposal(const std::string& text) {
  const std::size_t bar = text.find('|');
  LOCKSTEP_ENFORCE(bar != std::string::npos, "shrink: malformed proposal '{}' in the group's store", text);
  const std::vector<int> ended = decode(text.substr(bar + 1));
  return {decode(text.substr(0, bar)), std::set<int>(ended.begin(), ended.end())};
}

// The ranks of this group the launcher saw end (lockstep run --on-rank-
// failure continue records them): gone for certain.
std::set<int> ended_by_launcher(const GroupSpec& spec) {
  std::set<int> ended;
  if (!spec.diagnostics.launcher_store) return ended;
  for (int r = 0; r < spec.size; ++r) {
    try {
      if (launcher_saw_end(spec, spec.world_ranks[static_cast<std::size_t>(r)], spec.incarnation_of(r)))
        ended.insert(r);
    } catch (const Error&) {
      // The launcher's store is unreachable: nothing learnt from it.
    }
  }
  return ended;
}

// Tells the launcher which ranks the new group left out though nothing said
// they had ended (launcher_dropped_key): it kills them if they still run.
void report_dropped(const GroupSpec& spec, const std::vector<int>& members, const std::set<int>& ended) {
  if (!spec.diagnostics.launcher_store) return;
  for (int r = 0; r < spec.size; ++r) {
    if (ended.count(r) || std::find(members.begin(), members.end(), r) != members.end()) continue;
    try {
      spec.diagnostics.launcher_store->set(
          launcher_dropped_key(spec.launcher_round, spec.world_ranks[static_cast<std::size_t>(r)],
                               spec.incarnation_of(r)),
          "1");
    } catch (const Error&) {
      // The launcher's store is unreachable: the rank is left to its own
      // end (it is told it was left out if it ever runs again).
    }
  }
}

}  // namespace

const std::vector<int>& ProcessGroup::world_ranks() const { return impl_->spec.world_ranks; }

const std::vector<int>& ProcessGroup::members_of_parent() const { return impl_->spec.members_of_parent; }

std::shared_ptr<ProcessGroup> ProcessGroup::shrink(const std::vector<int>& lost, Duration window) {
  const GroupSpec& spec = impl_->spec;
  if (impl_->backend_name == "mpi" || impl_->backend_name == "nccl")
    throw ConfigError(fmt::format("shrink: the {} backend cannot re-form a group in place (docs/faults.md); the job "
                                  "restarts from its last checkpoint instead (lockstep run --max-restarts)",
                                  impl_->backend_name));
  if (spec.config.on_rank_failure == "restart")
    throw ConfigError("shrink: lockstep run stops and restarts every rank when one dies (--on-rank-failure restart, "
                      "the default), so this group does not re-form in place; run the job with --on-rank-failure "
                      "continue to let the survivors go on (docs/faults.md)");
  for (int r : lost)
    LOCKSTEP_CHECK_ARG(r >= 0 && r < size(), "shrink: lost rank {} is not a rank of this group of {}", r, size());
  const int attempt = (*spec.shrinks)++;
  Store& store = *impl_->store;
  const std::string at = fmt::format("shrink/{}/", attempt);
  store.set(at + fmt::format("here/{}", rank()), "1");

  const Deadline deadline = Deadline::after(window);
  std::set<int> gone(lost.begin(), lost.end());
  std::set<int> ended;
  std::vector<int> here;
  for (;;) {
    ended = ended_by_launcher(spec);
    gone.insert(ended.begin(), ended.end());
    here.clear();
    bool waiting_for_someone = false;
    for (int r = 0; r < size(); ++r) {
      if (store.check({at + fmt::format("here/{}", r)})) {
        here.push_back(r);
      } else if (gone.count(r) == 0) {
        waiting_for_someone = true;
      }
    }
    if (!waiting_for_someone || store.check({at + "members"}) || deadline.expired()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // A rank here that another named as lost is here after all (a reset
  // connection, not a death): it goes on with the others.
  const Proposal adopted = decode_proposal(store.compare_set(at + "members", "", encode(Proposal{here, ended})));
  const std::vector<int>& members = adopted.members;
  if (std::find(members.begin(), members.end(), rank()) == members.end())
    throw PeerError(fmt::format("rank {}/{}: left out of the re-formed group (its members are ranks {} of this "
                                "group): the others did not hear from this rank within {} s, and go on without it; "
                                "this rank must stop",
                                rank(), size(), encode(members), window.count() / 1000.0),
                    rank());
  const int possible = size() - static_cast<int>(adopted.ended.size());
  if (2 * static_cast<int>(members.size()) <= possible)
    throw Error(fmt::format("rank {}/{}: only {} of the {} ranks not known to have ended (ranks {}) are here; without "
                            "a majority this side stops, so that the two sides of a partition never both go on",
                            rank(), size(), members.size(), possible, encode(members)));
  report_dropped(spec, members, adopted.ended);

  GroupSpec next = spec;
  next.rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  next.size = static_cast<int>(members.size());
  next.key = fmt::format("{}/shrunk/{}", spec.key, attempt);
  next.world = false;
  next.finished_key.clear();
  next.world_ranks.clear();
  next.incarnations.clear();
  for (int r : members) {
    next.world_ranks.push_back(spec.world_ranks[static_cast<std::size_t>(r)]);
    next.incarnations.push_back(spec.incarnation_of(r));
  }
  next.members_of_parent = members;
  next.rendezvous_timeout = window;
  next.shrinks = std::make_shared<std::atomic<int>>(0);
  next.grows = std::make_shared<std::atomic<int>>(0);
  next.joined = false;
  next.tracer = impl_->diagnostics->shared_tracer();
  // Named by this group's ranks, and by world rank where a re-formed
  // group's differ: after a first loss, "rank 1" may be world rank 2.
  std::vector<int> left, left_in_world;
  for (int r = 0; r < size(); ++r)
    if (std::find(members.begin(), members.end(), r) == members.end()) {
      left.push_back(r);
      left_in_world.push_back(spec.world_ranks.empty() ? r : spec.world_ranks[static_cast<std::size_t>(r)]);
    }
  impl_->log.warn("re-forming the group in place without rank(s) {}{}: {} of {} ranks go on as ranks 0..{}",
                  encode(left),
                  left == left_in_world ? std::string() : fmt::format(" (world rank(s) {})", encode(left_in_world)),
                  members.size(), size(), members.size() - 1);
  try {
    return make_group(std::move(next));
  } catch (const Error& e) {
    // Naming no rank: which member failed to come is not known here.
    throw PeerError(fmt::format("rank {}/{}: the re-formed group of ranks {} could not be formed ({}); a member was "
                                "probably lost meanwhile: call shrink again",
                                rank(), size(), encode(members), e.what()));
  }
}

}  // namespace lockstep
