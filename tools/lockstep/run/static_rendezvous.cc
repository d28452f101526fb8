// rendezvous_static; see static_rendezvous.h.
#include "run/static_rendezvous.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/env.h"
#include "lockstep/error.h"
#include "run/interruption.h"
#include "run/node_takeover.h"

namespace lockstep::cli {

Round rendezvous_static(Store& store, const RunOptions& o, int node_rank, int nnodes, int nproc, int attempt,
                        int signal_fd) {
  Round round;
  round.number = attempt;
  round.node_rank = node_rank;
  round.nnodes = nnodes;
  if (nnodes == 1) {
    round.world_size = nproc;
    return round;
  }
  // Two launchers given the same --node-rank would each run as that node
  // and wait for the one nobody started; the second to claim it names both
  // and stops every node at once.
  const std::string me = launcher_claim();
  const std::string holder = store.compare_set(fmt::format("launcher/{}/node/{}", attempt, node_rank), "", me);
  if (holder != me) {
    const std::string what = fmt::format(
        "--node-rank {} was given to two launchers, {} and {}: give each node its own --node-rank from 0 to {}, or "
        "let the rendezvous number the nodes (--nnodes {}:{} --rdzv-backend c10d)",
        node_rank, holder, me, nnodes - 1, nnodes, nnodes);
    publish_interruption(store, what);
    throw ConfigError(what);
  }
  store.set(fmt::format("launcher/{}/nproc/{}", attempt, node_rank), std::to_string(nproc));
  std::vector<std::string> keys;
  for (int n = 0; n < nnodes; ++n) keys.push_back(fmt::format("launcher/{}/nproc/{}", attempt, n));
  const Deadline deadline = Deadline::after(Duration(static_cast<std::int64_t>(o.rendezvous_seconds * 1000)));
  // Said before a wait that may be long, so that whoever watches (a user, a
  // test) knows this node is waiting rather than stuck.
  std::fprintf(stderr, "lockstep run: node %d of %d is waiting for the other %d node(s) to join\n", node_rank, nnodes,
               nnodes - 1);
  if (!wait_for_keys(store, keys, deadline, signal_fd, fmt::format("the other {} node(s) to join", nnodes - 1))) {
    std::string missing;
    for (int n = 0; n < nnodes; ++n)
      if (!store.check({keys[static_cast<std::size_t>(n)]})) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", n);
    throw ConfigError(fmt::format("node(s) {} of {} did not join within {:.0f} s; start `lockstep run` with the same "
                                  "--nnodes, --master-addr and --master-port on every node",
                                  missing, nnodes, o.rendezvous_seconds));
  }
  for (int n = 0; n < nnodes; ++n) {
    const int count = static_cast<int>(parse_int(store.get(keys[static_cast<std::size_t>(n)])).value_or(0));
    if (n < node_rank) round.first_rank += count;
    round.world_size += count;
  }
  return round;
}

}  // namespace lockstep::cli
