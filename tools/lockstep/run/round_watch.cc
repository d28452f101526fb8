// watch_other_nodes; see round_watch.h.
#include "run/round_watch.h"

#include <fmt/format.h>

#include "common/launcher_keys.h"
#include "lockstep/error.h"
#include "run/failure_report.h"

namespace lockstep::cli {

std::function<std::optional<std::string>()> watch_other_nodes(Store& store, ElasticRendezvous* elastic,
                                                              const JobPlan& plan, const JobIdentity& job,
                                                              const std::string& store_name, const Round& round,
                                                              const RoundStore& round_store, StopReasons& stop,
                                                              bool nodes_lost_in_place) {
  const auto store_gone = [&plan, &job, &store_name, elastic](const Error& e) {
    if (plan.etcd)
      return fmt::format("{} refused this launcher's request ({}), and the job cannot go on without it{}", store_name,
                         e.what(), elastic->pause_note());
    return fmt::format("the store at {}:{} is gone ({}); the node that hosted it has left, and the job cannot go on "
                       "without it{}",
                       job.store_addr, job.store_port, e.what(), elastic ? elastic->pause_note() : "");
  };
  return [&store, elastic, &plan, &round, &round_store, &stop, store_gone, nodes_lost_in_place,
          failed_key = round_failed_key(round.number)]() -> std::optional<std::string> {
    if (elastic) elastic->note_poll(round);
    try {
      if (store.check({failed_key})) return "another node reported: " + store.get(failed_key);
      if (elastic && round.nnodes < plan.nodes.max && elastic->nodes_waiting(round) > 0) {
        stop.regroup = true;
        // Before any rank stops: the ranks that see a peer go read it
        // and report the planned stop, not a failure.
        const std::string why = "a node joins the job; re-forming the group";
        store.compare_set(launcher_stop_key(round.number), "", why);
        if (plan.etcd) tell_round_ranks(round_store, launcher_stop_key(round.number), why);
        return "a new node is waiting to join; re-forming the group";
      }
      if (elastic) {
        if (auto over = elastic->watch(round, !nodes_lost_in_place)) {
          stop.round_over = true;
          return over;
        }
      }
    } catch (const TimeoutError& e) {
      // Unless this launcher was stopped between its polls (then the
      // others went on without it for good).
      if (elastic && !elastic->paused_before_poll()) {
        stop.store_unanswered = true;
        return fmt::format("{} (or this node is cut off from it)", e.what());
      }
      stop.store_lost = true;
      return store_gone(e);
    } catch (const Error& e) {
      stop.store_lost = true;
      return store_gone(e);
    }
    return std::nullopt;
  };
}

}  // namespace lockstep::cli
