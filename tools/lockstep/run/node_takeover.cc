// attempt_to_join and take_over_lost_node; see node_takeover.h.
#include "run/node_takeover.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "common/host.h"
#include "common/launcher_keys.h"
#include "lockstep/error.h"
#include "run/failure_report.h"
#include "run/interruption.h"
#include "run/node_loss_watch.h"

namespace lockstep::cli {
namespace {

std::string node_key(int attempt, int node) { return fmt::format("launcher/{}/node/{}", attempt, node); }
std::string nproc_key(int attempt, int node) { return fmt::format("launcher/{}/nproc/{}", attempt, node); }

// Returns the node's generation once the others marked it lost; throws
// ConfigError when it is still heard from at the deadline or finished.
int wait_until_lost(Store& store, int node, int attempt, Duration wait_for_loss, int signal_fd) {
  std::fprintf(stderr,
               "lockstep run: node %d of the running job (attempt %d) is held by %s; waiting up to %.0f s for the "
               "others to count it lost, to take its place\n",
               node, attempt, store.get(node_key(attempt, node)).c_str(),
               std::chrono::duration<double>(wait_for_loss).count());
  const Deadline deadline = Deadline::after(wait_for_loss);
  for (;;) {
    const int generation = static_cast<int>(store.add(node_keys::generation(attempt, node), 0));
    if (store.check({node_keys::lost(attempt, node, generation)})) return generation;
    if (store.check({node_keys::finished(attempt, node)}))
      throw ConfigError(fmt::format("node {} of the running job has finished its part of it: there is no place to "
                                    "take; start this launcher for the job's next run",
                                    node));
    if (deadline.expired())
      throw ConfigError(fmt::format(
          "node {} of the running job (attempt {}) is still heard from in the store after {:.0f} s, so --node-rank "
          "{} was given to two launchers: give each node its own --node-rank, or start this one again once the job "
          "has lost node {}",
          node, attempt, std::chrono::duration<double>(wait_for_loss).count(), node, node));
    throw_if_interrupted(signal_fd, fmt::format("the job to count node {} lost", node));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Takes generation `lost` + 1 of the node, which the others counted lost;
// nullopt if another launcher took it first.
std::optional<NodeTakeover> claim_lost_node(Store& store, int node_rank, int nnodes, int nproc, int attempt,
                                            int lost) {
  NodeTakeover t;
  t.generation = lost + 1;
  const std::string me = launcher_claim();
  const std::string key = fmt::format("{}.{}", node_key(attempt, node_rank), t.generation);
  if (store.compare_set(key, "", me) != me) return std::nullopt;
  t.round.number = attempt;
  t.round.node_rank = node_rank;
  t.round.nnodes = nnodes;
  for (int n = 0; n < nnodes; ++n) {
    const int count = static_cast<int>(parse_int(store.get(nproc_key(attempt, n))).value_or(0));
    if (n == node_rank && count != nproc)
      throw ConfigError(fmt::format("node {} ran {} rank(s) and this launcher was given --nproc-per-node {}: the "
                                    "node that takes its place must run as many",
                                    node_rank, count, nproc));
    if (n < node_rank) t.round.first_rank += count;
    t.round.world_size += count;
  }
  for (int local = 0; local < nproc; ++local)
    t.incarnations.push_back(static_cast<int>(store.add(launcher_starts_key(attempt, t.round.first_rank + local), 1)));
  // Last: once the generation moves on, the others watch the node again.
  store.add(node_keys::lost_count(attempt), -1);
  store.add(node_keys::generation(attempt, node_rank), 1);
  return t;
}

std::string claim_of(long pid) { return fmt::format("host {} (pid {})", host_name(), pid); }

// Whether `holder`, a node's claim (launcher_claim()), names a launcher of
// this host whose process has ended. Another host's claim cannot be told
// from a twin's, and is not.
bool launcher_ended_on_this_host(const std::string& holder) {
  const auto at = holder.rfind("(pid ");
  if (at == std::string::npos || holder.back() != ')') return false;
  const auto pid = parse_int(holder.substr(at + 5, holder.size() - at - 6));
  return pid && *pid > 0 && holder == claim_of(static_cast<long>(*pid)) &&
         ::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

std::string launcher_claim() { return claim_of(static_cast<long>(::getpid())); }

int attempt_to_join(Store& store, int node_rank, bool restarts, Deadline deadline, int signal_fd) {
  int attempt = 0;
  for (;;) {
    while (store.check({node_key(attempt + 1, 0)})) ++attempt;
    // Held in a failed attempt: the node's first launcher died with it, and
    // node 0 is about to open the restart's attempt. Held, in an attempt
    // not yet failed, by a launcher of this host that has ended: it died a
    // moment ago and the others may not have seen it (a twin would be
    // alive; one that finished its part said so).
    const bool held = store.check({node_key(attempt, node_rank)});
    const bool failed = held && store.check({round_failed_key(attempt)});
    const bool holder_ended = held && !failed && restarts && !store.check({node_keys::finished(attempt, node_rank)}) &&
                              launcher_ended_on_this_host(store.get(node_key(attempt, node_rank)));
    if (holder_ended) {
      // The others see the death only when their ranks fail, and ranks
      // killed before they reached their peers fail no one: the peers wait
      // in the rendezvous for its whole timeout. This launcher knows, so
      // it says so, and the others restart now.
      store.compare_set(round_failed_key(attempt), "",
                        fmt::format("node {}'s launcher ({}) ended during attempt {}, and a launcher started again "
                                    "for node {} is waiting to join the restart",
                                    node_rank, store.get(node_key(attempt, node_rank)), attempt, node_rank));
    }
    if (!(failed || holder_ended) || deadline.expired()) return attempt;
    throw_if_interrupted(signal_fd, "the job's restart to open its next attempt");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::optional<NodeTakeover> take_over_lost_node(Store& store, int node_rank, int nnodes, int nproc, int attempt,
                                                Duration wait_for_loss, int signal_fd) {
  // Not held: the attempt waits for this node. Held but not beating: the
  // job does not go on without lost nodes, so the holder is a live twin.
  if (!store.check({node_key(attempt, node_rank)}) || !store.check({node_keys::beat(attempt, node_rank)}))
    return std::nullopt;
  const int lost = wait_until_lost(store, node_rank, attempt, wait_for_loss, signal_fd);
  auto t = claim_lost_node(store, node_rank, nnodes, nproc, attempt, lost);
  if (!t)
    throw ConfigError(fmt::format("{} took the place of lost node {} first; this launcher stops",
                                  store.get(fmt::format("{}.{}", node_key(attempt, node_rank), lost + 1)), node_rank));
  return t;
}

void publish_elastic_node(Store& store, const Round& round, int nproc) {
  store.set(node_key(round.number, round.node_rank), launcher_claim());
  store.set(nproc_key(round.number, round.node_rank), std::to_string(nproc));
}

std::optional<NodeTakeover> take_over_a_lost_node(Store& store, ElasticRendezvous& elastic, int nproc,
                                                  Duration wait_for_loss, int signal_fd) {
  std::optional<Deadline> deadline;
  for (;;) {
    const std::optional<Round> running = elastic.running_round();
    if (!running) return std::nullopt;
    const int r = running->number;
    for (int node = 0; node < running->nnodes && lost_node_count(store, r) > 0; ++node) {
      const int generation = static_cast<int>(store.add(node_keys::generation(r, node), 0));
      if (!store.check({node_keys::lost(r, node, generation)})) continue;
      if (auto t = claim_lost_node(store, node, running->nnodes, nproc, r, generation)) return t;
      // Another launcher took it first: the next one.
    }
    const bool full = running->nnodes >= elastic.options().max_nodes;
    if (!deadline) {
      const Duration wait = full ? elastic.options().join_timeout : wait_for_loss;
      deadline = Deadline::after(wait);
      std::fprintf(stderr,
                   "lockstep run: the job runs round %d with %d node(s)%s; waiting up to %.0f s for a node it loses, "
                   "to take its place (--on-rank-failure continue)\n",
                   r, running->nnodes, full ? " (--nnodes maximum: full)" : "",
                   std::chrono::duration<double>(wait).count());
    }
    if (deadline->expired()) return std::nullopt;
    throw_if_interrupted(signal_fd, "a node of the running job to be lost, to take its place");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace lockstep::cli
