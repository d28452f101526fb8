// NodeLossWatch; see node_loss_watch.h.
#include "run/node_loss_watch.h"

#include <cstdio>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "common/launcher_keys.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

std::string key(const Round& round, const std::string& what, int node) {
  return fmt::format("launcher/{}/{}/{}", round.number, what, node);
}

std::string lost_count_key(int round) { return fmt::format("launcher/{}/lost-nodes", round); }

}  // namespace

NodeLossWatch::NodeLossWatch(Store& store, const Round& round, int nproc, KeepAlive keep_alive)
    : store_(store.clone()),
      round_(round),
      heartbeat_(store.clone(), keep_alive.interval),
      silence_(keep_alive.limit()) {
  store_->set_timeout(keep_alive.limit());
  store_->set(key(round_, "ranks", round_.node_rank), fmt::format("{} {}", round_.first_rank, nproc));
  heartbeat_.beat_on(key(round_, "beat", round_.node_rank));
  gone_.insert(round_.node_rank);
}

std::optional<std::string> NodeLossWatch::poll() {
  try {
    std::map<int, std::int64_t> counters;
    for (int node = 0; node < round_.nnodes; ++node) {
      if (gone_.count(node)) continue;
      if (store_->check({key(round_, "finished", node)}) || store_->check({key(round_, "lost-node", node)})) {
        gone_.insert(node);  // done, or another launcher marked it lost
        continue;
      }
      counters[node] = store_->add(key(round_, "beat", node), 0);
    }
    if (store_->check({key(round_, "lost-node", round_.node_rank)}))
      return "the other nodes counted this node lost (it was not heard from in the store in time); they go on "
             "without it (--on-rank-failure continue)";
    if (auto silent = silence_.look(counters, Clock::now())) mark_lost(silent->node, silent->for_how_long);
  } catch (const Error& e) {
    return fmt::format("this node cannot reach the store ({}); the other nodes count it lost after {:.1f} s and go "
                       "on without it (--on-rank-failure continue)",
                       e.what(), std::chrono::duration<double>(silence_.limit()).count());
  }
  return std::nullopt;
}

void NodeLossWatch::mark_lost(int node, Duration silent_for) {
  gone_.insert(node);
  int first = -1, count = 0;
  {
    const std::string ranks_key = key(round_, "ranks", node);
    if (store_->check({ranks_key})) std::istringstream(store_->get(ranks_key)) >> first >> count;
  }
  for (int r = first; r >= 0 && r < first + count; ++r) {
    store_->set(launcher_lost_key(round_.number, r), "node lost");
    store_->set(launcher_node_lost_key(round_.number, r), "node lost");  // its replacements too
  }
  const std::string why = fmt::format("node {} stopped beating in the store", node);
  if (store_->compare_set(key(round_, "lost-node", node), "", why) == why)
    store_->add(lost_count_key(round_.number), 1);
  std::fprintf(stderr,
               "lockstep run: node %d (ranks %d-%d) has not been heard from in the store for %.1f s (killed, its "
               "host gone, or cut off); its ranks count as ended and the others go on without them "
               "(--on-rank-failure continue)\n",
               node, first, first + count - 1, std::chrono::duration<double>(silent_for).count());
}

void NodeLossWatch::mark_finished() {
  store_->set(key(round_, "finished", round_.node_rank), "1");
  heartbeat_.stop();
}

std::int64_t lost_node_count(Store& store, int round) { return store.add(lost_count_key(round), 0); }

}  // namespace lockstep::cli
