// What a launcher watches in the store while its ranks run (step 3 of the
// attempt, attempt_loop.cc): a failure another node reported, a node waiting
// to join an elastic job below MAX (the group re-forms for it), a round
// that is over (a node stopped beating, or the rendezvous moved on), and
// the store itself not answering or gone. The watch is the supervisor's
// remote_failure poll (supervisor.h); it notes why it stopped the ranks in
// StopReasons. Not thread-safe: polled from the launcher's one thread.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "lockstep/store.h"
#include "run/elastic_rendezvous.h"
#include "run/job_plan.h"
#include "run/round_store.h"

namespace lockstep::cli {

// Why an attempt's ranks were stopped, besides a rank's failure; set by the
// watch and by the attempt loop as it reports a failure.
struct StopReasons {
  bool regroup = false;     // a node waits to join: stop, and re-form the group
  bool store_lost = false;  // the store's host is gone: nothing to re-form with
  bool round_over = false;  // a node stopped beating, or the rendezvous moved on: re-form
  // The store did not answer in time while this launcher ran: this node
  // may be cut off from it for a while, not for good.
  bool store_unanswered = false;
};

// The poll for SupervisorOptions::remote_failure during `round`: nullopt
// while the round goes on; otherwise why this node's ranks stop, with the
// reason noted in `stop`. `elastic`: null in a job with a fixed node count.
// When a node waits to join, it first tells the ranks (launcher_stop_key)
// that the stop is planned. `store_name` names etcd in messages; `job`
// names the TcpStore. `nodes_lost_in_place`: under --on-rank-failure
// continue an elastic job does not re-form its round for a silent node
// (NodeLossWatch marks it lost and the others go on), so the watch leaves
// the elastic heartbeats alone. Every reference must outlive the returned
// function.
std::function<std::optional<std::string>()> watch_other_nodes(Store& store, ElasticRendezvous* elastic,
                                                              const JobPlan& plan, const JobIdentity& job,
                                                              const std::string& store_name, const Round& round,
                                                              const RoundStore& round_store, StopReasons& stop,
                                                              bool nodes_lost_in_place = false);

}  // namespace lockstep::cli
