// Group rendezvous; see rendezvous.h.
#include "comm/rendezvous.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/clock.h"
#include "common/host.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr char kErrorKey[] = "rendezvous/error";

std::string host_key(int rank) { return fmt::format("rendezvous/host/{}", rank); }

[[noreturn]] void fail(Store& store, const std::string& message) {
  store.set(kErrorKey, message);
  throw ConfigError(message);
}

}  // namespace

std::string host_identity() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return fmt::format("{}/{}", host_name(), boot_id);
}

namespace {

// Claims `rank` in the store for this call. A claim names the host and
// process (and a nonce for this call), so a second claim says whether
// another process has the same RANK or this one joined twice.
void claim_rank(Store& store, int rank) {
  const std::string me = fmt::format("{}\n{}\n{}", host_name(), ::getpid(), random_hex(8));
  const std::string holder = store.compare_set(fmt::format("rendezvous/claims/{}", rank), "", me);
  if (holder == me) return;
  const auto first = holder.find('\n');
  const auto second = holder.find('\n', first == std::string::npos ? first : first + 1);
  const std::string host = holder.substr(0, first);
  const std::string pid = first == std::string::npos ? "" : holder.substr(first + 1, second - first - 1);
  if (host == host_name() && pid == std::to_string(::getpid()))
    fail(store, fmt::format("rank {}'s process (pid {} on {}) called init_process_group twice with this store: a "
                            "process joins a job once (a store keeps its keys after a group ends). For another "
                            "group of the same ranks use new_group; for a second job give it its own MASTER_PORT "
                            "or LOCKSTEP_RUN_ID",
                            rank, pid, host));
  fail(store, fmt::format("two processes were started as rank {} (pid {} on {} and pid {} on {}); every rank needs a "
                          "distinct RANK (or the store still holds an earlier run's keys: give each run its own "
                          "MASTER_PORT or LOCKSTEP_RUN_ID)",
                          rank, pid, host, ::getpid(), host_name()));
}

}  // namespace

std::vector<std::string> rendezvous(Store& store, int rank, int world_size, Duration timeout,
                                    const std::string& host_id, Os& clock) {
  claim_rank(store, rank);
  const std::string size_text = std::to_string(world_size);
  const std::string agreed = store.compare_set("rendezvous/world_size", "", size_text);
  if (agreed != size_text)
    fail(store, fmt::format("rank {} was started with world size {} but another rank registered world size {}; "
                            "every rank must get the same WORLD_SIZE",
                            rank, world_size, agreed));
  store.set(host_key(rank), host_id.empty() ? host_identity() : host_id);

  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(host_key(r));
  // The store waits in slices of real time; the deadline is on `clock`.
  const Deadline deadline = deadline_after(clock, timeout);
  for (;;) {
    try {
      store.wait(keys, std::min<Duration>(remaining(clock, deadline), std::chrono::seconds(1)));
      break;
    } catch (const TimeoutError&) {
      if (store.check({kErrorKey})) throw ConfigError(store.get(kErrorKey));
      if (!expired(clock, deadline)) continue;
      std::string missing;
      int count = 0;
      for (int r = 0; r < world_size; ++r) {
        if (store.check({host_key(r)})) continue;
        if (++count <= 16) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      }
      throw TimeoutError(fmt::format("rank {}: {} of {} ranks (rank(s) {}) did not join within {:.0f} s; were they "
                                     "started, with the same MASTER_ADDR/MASTER_PORT, and did they fail early?",
                                     rank, count, world_size, missing, static_cast<double>(timeout.count()) / 1000.0));
    }
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(world_size));
  for (const auto& k : keys) hosts.push_back(store.get(k));
  return hosts;
}

void agree_on_member_order(Store& store, const std::string& key, const std::vector<int>& ranks, int world_rank,
                           Duration timeout) {
  const auto list_of = [](const std::vector<int>& members) { return fmt::format("[{}]", fmt::join(members, ", ")); };
  const auto order_key = [&](int r) { return fmt::format("{}/order/{}", key, r); };
  const std::string mine = list_of(ranks);
  store.set(order_key(world_rank), mine);
  std::vector<std::string> keys;
  for (int r : ranks) keys.push_back(order_key(r));
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    std::string missing;
    for (int r : ranks)
      if (!store.check({order_key(r)})) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
    throw TimeoutError(fmt::format("new_group({}) on rank {}: rank(s) {} did not call new_group with these ranks "
                                   "within {:.0f} s (they passed other ranks, called it fewer times, or not at all); "
                                   "every listed rank must call new_group with the same list",
                                   mine, world_rank, missing, static_cast<double>(timeout.count()) / 1000.0));
  }
  for (int r : ranks) {
    const std::string theirs = store.get(order_key(r));
    if (theirs != mine)
      throw MismatchError(fmt::format("new_group: rank {} passed the ranks {} but rank {} passed {}; every member must "
                                      "pass the same list in the same order (the order numbers the new group's ranks)",
                                      world_rank, mine, r, theirs));
  }
}

}  // namespace lockstep
