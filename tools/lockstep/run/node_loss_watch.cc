// NodeLossWatch; see node_loss_watch.h.
#include "run/node_loss_watch.h"

#include <cstdio>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "common/launcher_keys.h"
#include "lockstep/error.h"

namespace lockstep::cli {

namespace node_keys {
std::string beat(int round, int node) { return fmt::format("launcher/{}/beat/{}", round, node); }
std::string ranks(int round, int node) { return fmt::format("launcher/{}/ranks/{}", round, node); }
std::string finished(int round, int node) { return fmt::format("launcher/{}/finished/{}", round, node); }
std::string generation(int round, int node) { return fmt::format("launcher/{}/generation/{}", round, node); }
std::string lost(int round, int node, int generation) {
  return fmt::format("launcher/{}/lost-node/{}.{}", round, node, generation);
}
std::string lost_count(int round) { return fmt::format("launcher/{}/lost-nodes", round); }
std::string done(int round) { return fmt::format("launcher/{}/done", round); }
std::string emptied(int round) { return fmt::format("launcher/{}/emptied", round); }
}  // namespace node_keys

namespace {

std::string losing_key(int round, int node, int generation) {
  return fmt::format("launcher/{}/losing/{}.{}", round, node, generation);
}

}  // namespace

NodeLossWatch::NodeLossWatch(Store& store, const Round& round, int nproc, KeepAlive keep_alive, int generation,
                             TellRanks tell_ranks)
    : store_(store.clone()),
      round_(round),
      generation_(generation),
      tell_ranks_(std::move(tell_ranks)),
      heartbeat_(store.clone(), keep_alive.interval),
      silence_(keep_alive.limit()) {
  store_->set_timeout(keep_alive.limit());
  store_->set(node_keys::ranks(round_.number, round_.node_rank), fmt::format("{} {}", round_.first_rank, nproc));
  heartbeat_.beat_on(node_keys::beat(round_.number, round_.node_rank));
  gone_[round_.node_rank] = generation_;
}

std::optional<std::string> NodeLossWatch::poll() {
  try {
    std::map<int, std::int64_t> counters;
    std::map<int, int> generations;
    for (int node = 0; node < round_.nnodes; ++node) {
      if (node == round_.node_rank) continue;
      // A node taken over since it was lost is watched again (its new
      // launcher beats on the same counter).
      const int generation = static_cast<int>(store_->add(node_keys::generation(round_.number, node), 0));
      const auto gone = gone_.find(node);
      if (gone != gone_.end() && gone->second == generation) continue;
      if (store_->check({node_keys::finished(round_.number, node)}) ||
          store_->check({node_keys::lost(round_.number, node, generation)})) {
        gone_[node] = generation;  // done, or another launcher marked it lost
        silence_.forget(node);
        continue;
      }
      counters[node] = store_->add(node_keys::beat(round_.number, node), 0);
      generations[node] = generation;
    }
    if (store_->check({node_keys::lost(round_.number, round_.node_rank, generation_)}))
      return "the other nodes counted this node lost (it was not heard from in the store in time); they go on "
             "without it (--on-rank-failure continue)";
    if (auto silent = silence_.look(counters, Clock::now()))
      mark_lost(silent->node, generations[silent->node], silent->for_how_long);
  } catch (const Error& e) {
    return fmt::format("this node cannot reach the store ({}); the other nodes count it lost after {:.1f} s and go "
                       "on without it (--on-rank-failure continue)",
                       e.what(), std::chrono::duration<double>(silence_.limit()).count());
  }
  return std::nullopt;
}

// One launcher marks each generation lost (the one that claims it first):
// it writes the ranks' keys before the marker, so that a launcher taking
// the node over, which waits for the marker, starts its ranks with starts
// numbered after every one the marker covers.
void NodeLossWatch::mark_lost(int node, int generation, Duration silent_for) {
  gone_[node] = generation;
  silence_.forget(node);
  int first = -1, count = 0;
  {
    const std::string ranks_key = node_keys::ranks(round_.number, node);
    if (store_->check({ranks_key})) std::istringstream(store_->get(ranks_key)) >> first >> count;
  }
  const std::string me = fmt::format("node {} (generation {})", round_.node_rank, generation_);
  if (store_->compare_set(losing_key(round_.number, node, generation), "", me) == me) {
    const auto tell = [&](const std::string& key, const std::string& value) {
      store_->set(key, value);
      if (tell_ranks_) tell_ranks_(key, value);
    };
    for (int r = first; r >= 0 && r < first + count; ++r) {
      tell(launcher_lost_key(round_.number, r), "node lost");
      const std::int64_t last_start = store_->add(launcher_starts_key(round_.number, r), 0);
      tell(launcher_node_lost_key(round_.number, r), std::to_string(last_start));  // its replacements too
    }
    store_->set(node_keys::lost(round_.number, node, generation), fmt::format("node {} stopped beating in the store", node));
    store_->add(node_keys::lost_count(round_.number), 1);
  }
  std::fprintf(stderr,
               "lockstep run: node %d (ranks %d-%d) has not been heard from in the store for %.1f s (killed, its "
               "host gone, or cut off); its ranks count as ended and the others go on without them "
               "(--on-rank-failure continue)\n",
               node, first, first + count - 1, std::chrono::duration<double>(silent_for).count());
}

void NodeLossWatch::mark_finished() {
  store_->set(node_keys::finished(round_.number, round_.node_rank), "1");
  heartbeat_.stop();
}

std::int64_t lost_node_count(Store& store, int round) { return store.add(node_keys::lost_count(round), 0); }

}  // namespace lockstep::cli
