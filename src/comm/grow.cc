// Replacements joining a running group: ProcessGroup::grow on the members'
// side, join_running_group on the replacement's (process_group.h has the
// contract, join_board.h the keys). Attempt k of a group's grows agrees
// under the group's "grow/<k>/members": rank 0 stores the members (this
// group's and the replacements it admits, in world-rank order) and the new
// group's key, "<this group's key>/grown/<k>"; it tells each replacement
// the same text under the board's admit key. Every member and replacement
// then forms the new group: its own store keys, rendezvous, connections.
// An incarnation is admitted once: one that does not come is not asked
// for again (the launcher starts another if its process ended).
#include <algorithm>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/group_impl.h"
#include "comm/join_board.h"
#include "common/enforce.h"
#include "common/env.h"
#include "common/launcher_keys.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using join_board::Member;

bool is_member(const GroupSpec& spec, int world_rank) {
  return std::find(spec.world_ranks.begin(), spec.world_ranks.end(), world_rank) != spec.world_ranks.end();
}

// The replacement of world rank `rank` waiting to be admitted, if any: it
// asked, is not yet admitted, and has not ended.
std::optional<Member> waiting_replacement(const GroupSpec& spec, int rank) {
  Store& root = *spec.root_store;
  const std::string ask = join_board::ask(spec.join_board, rank);
  if (is_member(spec, rank) || !root.check({ask})) return std::nullopt;
  const Member m{rank, std::stoi(root.get(ask))};
  if (root.check({join_board::admit(spec.join_board, m.rank, m.incarnation)}) ||
      launcher_saw_end(spec, m.rank, m.incarnation))
    return std::nullopt;
  return m;
}

std::string describe(const std::vector<Member>& members) {
  std::vector<std::string> out;
  for (const Member& m : members) out.push_back(std::to_string(m.rank));
  return fmt::format("{}", fmt::join(out, ","));
}

// The spec of the group `key` of `members`, for the member `me`.
GroupSpec spec_of(GroupSpec spec, const std::string& key, const std::vector<Member>& members, int me) {
  spec.key = key;
  spec.size = static_cast<int>(members.size());
  spec.world_ranks.clear();
  spec.incarnations.clear();
  for (const Member& m : members) {
    if (m.rank == me) spec.rank = static_cast<int>(spec.world_ranks.size());
    spec.world_ranks.push_back(m.rank);
    spec.incarnations.push_back(m.incarnation);
  }
  spec.world = false;
  spec.finished_key.clear();
  spec.members_of_parent.clear();
  spec.shrinks = std::make_shared<std::atomic<int>>(0);
  spec.grows = std::make_shared<std::atomic<int>>(0);
  spec.joined = false;
  return spec;
}

// What a launcher says of world rank `rank`, outside the group: its latest
// start is on its way (started, neither admitted nor ended), or it was a
// member (the first start, or one admitted) that ended where the launcher
// has not yet said so, or nothing is to come. The launcher counts a
// replacement's start before it says its predecessor's end, so the count
// is read again after the end: a start counted meanwhile is the answer.
enum class LauncherOutlook { nothing, started, end_unseen };

LauncherOutlook launcher_outlook(const GroupSpec& spec, int rank) {
  Store& launcher = *spec.diagnostics.launcher_store;
  const auto latest_start = [&] {
    return static_cast<int>(launcher.add(launcher_starts_key(spec.launcher_round, rank), 0));
  };
  int latest = latest_start();
  for (;;) {
    // The first start is incarnation 0, counted nowhere.
    const bool was_member = latest <= 0 || spec.root_store->check({join_board::admit(spec.join_board, rank, latest)});
    LauncherOutlook outlook = LauncherOutlook::nothing;
    if (!launcher_saw_end(spec, rank, latest))
      outlook = was_member ? LauncherOutlook::end_unseen : LauncherOutlook::started;
    const int again = latest_start();
    if (again == latest) return outlook;
    latest = again;
  }
}

std::vector<int> ranks_outside_with(const GroupSpec& spec, LauncherOutlook wanted) {
  std::vector<int> ranks;
  for (int r = 0; r < spec.job_size; ++r)
    if (!is_member(spec, r) && launcher_outlook(spec, r) == wanted) ranks.push_back(r);
  return ranks;
}

}  // namespace

bool launcher_saw_end(const GroupSpec& spec, int world_rank, int incarnation) {
  if (!spec.diagnostics.launcher_store) return false;
  Store& launcher = *spec.diagnostics.launcher_store;
  if (launcher.check({launcher_lost_key(spec.launcher_round, world_rank, incarnation)})) return true;
  // A lost node's starts ended; a node that took its place starts later ones.
  const std::string node_lost = launcher_node_lost_key(spec.launcher_round, world_rank);
  if (!launcher.check({node_lost})) return false;
  const std::optional<std::int64_t> last_lost = parse_int(launcher.get(node_lost));
  return !last_lost || incarnation <= *last_lost;
}

bool ProcessGroup::joined() const { return impl_->spec.joined; }

int ProcessGroup::job_size() const { return impl_->spec.job_size > 0 ? impl_->spec.job_size : size(); }

void ProcessGroup::close_to_replacements() {
  const GroupSpec& spec = impl_->spec;
  if (!spec.join_board.empty()) spec.root_store->set(join_board::closed(spec.join_board), "1");
}

std::vector<int> ProcessGroup::replacements_waiting() {
  const GroupSpec& spec = impl_->spec;
  if (spec.join_board.empty() || spec.job_size <= 0) return {};
  const std::int64_t asks = spec.root_store->add(join_board::asks(spec.join_board), 0);
  if (asks == spec.asks_seen->load()) return {};
  std::vector<int> waiting;
  for (int r = 0; r < spec.job_size; ++r)
    if (waiting_replacement(spec, r)) waiting.push_back(r);
  // Read again at each look while one waits (its admission may fail).
  if (waiting.empty()) spec.asks_seen->store(asks);
  return waiting;
}


std::vector<int> ProcessGroup::replacements_started() {
  const GroupSpec& spec = impl_->spec;
  if (spec.join_board.empty() || spec.job_size <= 0 || !spec.diagnostics.launcher_store) return {};
  return ranks_outside_with(spec, LauncherOutlook::started);
}

std::vector<int> ProcessGroup::ends_unseen_by_launcher() {
  const GroupSpec& spec = impl_->spec;
  if (spec.join_board.empty() || spec.job_size <= 0 || !spec.diagnostics.launcher_store ||
      spec.config.max_replacements <= 0)
    return {};
  return ranks_outside_with(spec, LauncherOutlook::end_unseen);
}

std::shared_ptr<ProcessGroup> ProcessGroup::grow(const std::vector<int>& replacements, Duration window) {
  const GroupSpec& spec = impl_->spec;
  if (spec.join_board.empty())
    throw InvalidArgument("grow: replacements join the job's group (the world, or a group shrink or grow made from "
                          "it), not a sub-group");
  const int attempt = (*spec.grows)++;
  const std::string at = fmt::format("grow/{}/members", attempt);
  Store& store = *impl_->store;
  std::string text;
  std::vector<Member> joining;
  if (rank() == 0) {
    std::vector<Member> members;
    for (int r = 0; r < size(); ++r) members.push_back({spec.world_ranks[static_cast<std::size_t>(r)], spec.incarnation_of(r)});
    for (int w : replacements) {
      LOCKSTEP_CHECK_ARG(w >= 0 && w < job_size(), "grow: world rank {} is not a rank of this job of {}", w, job_size());
      if (auto m = waiting_replacement(spec, w)) joining.push_back(*m);
    }
    members.insert(members.end(), joining.begin(), joining.end());
    std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) { return a.rank < b.rank; });
    text = join_board::admission_text(joining.empty() ? "" : fmt::format("{}/grown/{}", spec.key, attempt), members);
    store.set(at, text);
    for (const Member& m : joining)
      spec.root_store->set(join_board::admit(spec.join_board, m.rank, m.incarnation), text);
  } else {
    try {
      store.wait({at}, window);
    } catch (const TimeoutError&) {
      throw PeerError(fmt::format("rank {}/{}: rank 0 did not say within {} s which replacements join (grow); it is "
                                  "probably lost",
                                  rank(), size(), window.count() / 1000.0),
                      0);
    }
    text = store.get(at);
  }
  std::string key;
  const std::vector<Member> members = join_board::members_of(text, &key);
  if (key.empty()) return nullptr;  // none still waited
  const int me = spec.world_ranks[static_cast<std::size_t>(rank())];
  GroupSpec next = spec_of(spec, key, members, me);
  next.rendezvous_timeout = window;
  next.tracer = impl_->diagnostics->shared_tracer();
  std::vector<Member> added;
  for (const Member& m : members)
    if (!is_member(spec, m.rank)) added.push_back(m);
  impl_->log.warn("growing the group: world rank(s) {} join as replacements, {} ranks go on", describe(added),
                  members.size());
  try {
    return make_group(std::move(next));
  } catch (const Error& e) {
    throw Error(fmt::format("rank {}/{}: the group grown by replacement(s) of world rank(s) {} could not be formed "
                            "within {} s ({}); a replacement probably ended before it came. This group is intact",
                            rank(), size(), describe(added), window.count() / 1000.0, e.what()));
  }
}

std::shared_ptr<ProcessGroup> join_running_group(GroupSpec spec, int incarnation) {
  Store& root = *spec.root_store;
  const int me = spec.rank;
  const std::string admit = join_board::admit(spec.join_board, me, incarnation);
  root.set(join_board::ask(spec.join_board, me), std::to_string(incarnation));
  root.add(join_board::asks(spec.join_board), 1);
  spec.log.info("replacement {} of world rank {}: waiting to join the running group at its next step boundary",
                incarnation, me);
  const Duration limit = spec.timeout;
  const Deadline deadline = Deadline::after(limit);
  while (!root.check({admit})) {
    if (root.check({join_board::closed(spec.join_board)}))
      throw JobFinished(fmt::format("world rank {}: the job finished before this replacement (its start {} in this "
                                    "round) could join it; nothing is left to do",
                                    me, incarnation));
    if (deadline.expired())
      throw TimeoutError(fmt::format(
          "world rank {}: the running group did not admit this replacement within {} s: its ranks did not reach a "
          "step boundary that looks for replacements (lockstep::torch::ResilientTrainer does, at each step's commit "
          "point), or the job ended; LOCKSTEP_TIMEOUT sets how long to wait",
          me, limit.count() / 1000.0));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string key;
  const std::vector<Member> members = join_board::members_of(root.get(admit), &key);
  const int job_size = spec.size;
  GroupSpec next = spec_of(std::move(spec), key, members, me);
  next.job_size = job_size;
  next.joined = true;
  next.log = next.log.for_rank(next.rank, next.size);
  next.log.warn("world rank {} joins the running group '{}' as its rank {} of {} (replacement {})", me, key, next.rank,
                next.size, incarnation);
  std::shared_ptr<Store> launcher = next.diagnostics.launcher_store;
  const int round = next.launcher_round;
  std::shared_ptr<ProcessGroup> group = make_group(std::move(next));
  if (launcher) launcher->set(launcher_joined_key(round, me, incarnation), "1");
  return group;
}

}  // namespace lockstep
