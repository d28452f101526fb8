// SilentNodeWatch; see silent_node_watch.h.
#include "run/silent_node_watch.h"

#include <map>

#include <fmt/format.h>

#include "lockstep/error.h"
#include "run/node_loss_watch.h"

namespace lockstep::cli {

SilentNodeWatch::SilentNodeWatch(Store& store, const Round& round, KeepAlive keep_alive)
    : store_(store.clone()),
      round_(round),
      keep_alive_(keep_alive),
      heartbeat_(store.clone(), keep_alive.interval),
      silence_(keep_alive.limit()) {
  store_->set_timeout(keep_alive.limit());
  heartbeat_.beat_on(node_keys::beat(round_.number, round_.node_rank));
}

std::optional<std::string> SilentNodeWatch::poll() {
  const auto now = Clock::now();
  if (last_look_ && now - *last_look_ < keep_alive_.interval / 2) return std::nullopt;
  last_look_ = now;
  // The next two nodes in ring order that have not finished, as the
  // elastic watch does: every node is watched by two, and the store reads
  // grow with the nodes, not with their square.
  std::map<int, std::int64_t> counters;
  try {
    for (int k = 1; k < round_.nnodes && counters.size() < 2; ++k) {
      const int node = (round_.node_rank + k) % round_.nnodes;
      if (store_->check({node_keys::finished(round_.number, node)})) continue;
      counters[node] = store_->add(node_keys::beat(round_.number, node), 0);
    }
  } catch (const Error&) {
    return std::nullopt;
  }
  const auto silent = silence_.look(counters, now);
  if (!silent) return std::nullopt;
  return fmt::format("node {} has not been heard from in the store for {:.1f} s (its launcher killed, its host "
                     "gone, or cut off; a beat every {:.1f} s, silent after {:.1f} s: --rdzv-conf "
                     "keep_alive_interval, keep_alive_max_attempt)",
                     silent->node, std::chrono::duration<double>(silent->for_how_long).count(),
                     std::chrono::duration<double>(keep_alive_.interval).count(),
                     std::chrono::duration<double>(keep_alive_.limit()).count());
}

void SilentNodeWatch::mark_finished() {
  store_->set(node_keys::finished(round_.number, round_.node_rank), "1");
  heartbeat_.stop();
}

}  // namespace lockstep::cli
