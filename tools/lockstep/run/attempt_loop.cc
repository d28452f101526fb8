// run_nodes: the launchers' store, then the attempt loop with restarts and
// re-forms. See attempt_loop.h, run_command.h and docs/launcher.md.
//
// One attempt, step by step:
//   1. (several nodes) each launcher publishes its process count under the
//      attempt's keys and waits for every node's, which fixes the world size
//      and each node's first global rank;
//   2. it starts its ranks with the environment torchrun would give them;
//   3. it supervises them (supervisor.h); a failure anywhere is published in
//      the store so every node stops its ranks too;
//   4. on success every node reports done; node 0, which hosts the store,
//      waits for all of them before it exits.
// After each attempt it removes the shared-memory segments its ranks left
// (a rank killed during shm set-up leaves its peers' segments linked): their
// names carry this launcher's LOCKSTEP_SHM_TAG. Every wait for other nodes
// reads the signalfd between short slices (interruption.h), so Ctrl-C and
// SIGTERM work at every stage.
#include "run/attempt_loop.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/launcher_cleanup.h"
#include "common/env.h"
#include "common/env_vars.h"
#include "common/host.h"
#include "common/launcher_keys.h"
#include "diag/tracer.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "run/elastic_job.h"
#include "run/elastic_rendezvous.h"
#include "run/emptied_node.h"
#include "run/failure_report.h"
#include "run/interruption.h"
#include "run/launcher_store.h"
#include "run/node_loss_watch.h"
#include "run/node_takeover.h"
#include "run/rank_environment.h"
#include "run/round_store.h"
#include "run/round_watch.h"
#include "run/run_arguments.h"
#include "run/scratch_directory.h"
#include "run/silent_node_watch.h"
#include "run/static_rendezvous.h"
#include "run/supervisor.h"

namespace lockstep::cli {
namespace {

// The store's host waits for every node to finish before exiting (but for
// nodes lost under --on-rank-failure continue).
void wait_for_nodes(Store& store, int nnodes, int round, int signal_fd,
                    const std::function<std::optional<std::string>()>& gone = nullptr) {
  const std::string done = node_keys::done(round);
  const std::string failed = round_failed_key(round);
  while (store.add(done, 0) + lost_node_count(store, round) < nnodes && !store.check({failed})) {
    throw_if_interrupted(signal_fd, "the other nodes to finish");
    if (auto why = gone ? gone() : std::nullopt) {
      std::fprintf(stderr, "lockstep run: not waiting for the other nodes to finish: %s\n", why->c_str());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Removes what this node's ranks left in /dev/shm; they have all exited.
void remove_leftover_segments(const std::string& shm_tag) {
  const std::size_t removed = remove_launcher_segments(shm_tag);
  if (removed > 0)
    std::fprintf(stderr, "lockstep run: removed %zu shared-memory segment(s) left in /dev/shm by this node's ranks\n",
                 removed);
}

// With LOCKSTEP_TRACE set, each rank wrote <prefix>.rank<r>.json: merge this
// node's into one file (<prefix>.json on node 0, <prefix>.node<k>.json on
// others), one track group per rank.
void merge_rank_traces(const Round& round, int nproc) {
  const auto prefix = env_string(env::kTrace);
  if (!prefix) return;
  std::vector<std::string> files;
  for (int local = 0; local < nproc; ++local) files.push_back(fmt::format("{}.rank{}.json", *prefix, round.first_rank + local));
  const std::string out = round.node_rank == 0 ? *prefix + ".json" : fmt::format("{}.node{}.json", *prefix, round.node_rank);
  const std::size_t merged = diag::merge_traces(files, out);
  if (merged > 0) std::fprintf(stderr, "lockstep run: timeline of %zu rank(s) in %s (open it in Perfetto or chrome://tracing)\n", merged, out.c_str());
}

// --on-rank-failure continue, when the ranks that outlived a death failed
// after it: the program does not go on in place (docs/faults.md), and the
// job falls back to what restart does.
void print_fallback_to_restart(const RankFailure& survivor, const RankFailure& death, int failures, int max_restarts) {
  // Its error: the last line that does not continue another (indented).
  std::string last = survivor.status.describe();
  for (const std::string& line : survivor.last_stderr)
    if (!line.empty() && line[0] != ' ') last = line.size() > 240 ? line.substr(0, 240) + "..." : line;
  std::fprintf(stderr,
               "lockstep run: rank %d died and the others could not go on in place (rank %d: %s): the program must "
               "re-form its group (lockstep::torch::ResilientTrainer) and keep no state on one rank only "
               "(ZeroRedundancyOptimizer; the trainer's sharded optimizer state whose owner and backup both died), "
               "a fully_shard model needs ShardedResilientTrainer with a ShardBackup (and loses a shard with its "
               "only copy when two ring neighbours die at once), and SyncBatchNorm cannot yet survive a death "
               "(docs/faults.md); %s\n",
               death.rank, survivor.rank, last.c_str(),
               failures < max_restarts ? "falling back to the restart of every rank, as --on-rank-failure restart does"
                                       : "the job fails (give --max-restarts N to restart it from its checkpoint "
                                         "instead)");
}

// How often each node beats, and after how long a silent one is gone:
// --rdzv-conf's keep_alive_* where given, else `fallback`'s.
KeepAlive keep_alive_of(const RunOptions& o, KeepAlive fallback) {
  const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);
  return fallback.overridden_by(conf.keep_alive_interval, conf.keep_alive_max_attempt);
}

// Under --on-rank-failure continue: every second, lost after three; the
// survivors wait this long at most.
KeepAlive continue_keep_alive(const RunOptions& o) {
  return keep_alive_of(o, KeepAlive{.interval = std::chrono::seconds(1), .max_attempts = 3});
}

// Under etcd the ranks read the round's store, not the launchers': a start
// of `rank` beyond its first is copied there, so that a trainer that has
// just re-formed sees a replacement on its way and waits for it
// (ProcessGroup::replacements_started) instead of redoing the step short.
void tell_ranks_of_start(const RoundStore& round_store, const Round& round, int rank, int incarnation) {
  raise_round_count(round_store, launcher_starts_key(round.number, rank), incarnation);
}

// --on-rank-failure continue, several nodes: every rank of this node died
// and the other nodes' go on without them (emptied_node.h). The outcome
// becomes theirs: `result` turns ok when they finish, a failure reported by
// another node when the watch stops the round; when no rank is left
// anywhere it stays this node's failure.
void await_outcome_without_local_ranks(Store& store, const Round& round, int signal_fd,
                                       const std::function<std::optional<std::string>()>& watch,
                                       AttemptResult& result) {
  std::fprintf(stderr, "lockstep run: every rank of this node has died; the other nodes' ranks go on without them "
               "(--on-rank-failure continue), and this launcher waits for the job's outcome\n");
  const RoundOutcome outcome = await_round_outcome(store, round, signal_fd, watch);
  switch (outcome.kind) {
    case RoundOutcome::Kind::kFinished:
      std::fprintf(stderr, "lockstep run: the other nodes finished the job without this node's ranks\n");
      result.ok = true;
      result.first_failure.reset();
      return;
    case RoundOutcome::Kind::kStopped:
      result.first_failure->reported_by = outcome.why;
      return;
    case RoundOutcome::Kind::kNoRankLeft:
      std::fprintf(stderr, "lockstep run: no node has a rank left: the job cannot go on in place\n");
      return;
  }
}

// The supervisor's options for the ranks of `round` as the command line
// sets them; the loop adds each rank's directory and the watch of the
// other nodes.
SupervisorOptions supervisor_options(const RunOptions& o, const JobIdentity& job, const Round& round) {
  SupervisorOptions sup;
  sup.prefix_output = !o.no_prefix;
  sup.write_logs = !o.log_dir.empty();
  sup.tee = o.tee;
  sup.redirects = o.redirects;
  const std::vector<int> shown = parse_local_ranks(o.local_ranks_filter);
  sup.console_ranks = std::set<int>(shown.begin(), shown.end());
  sup.stdout_filters = parse_filters(o.duplicate_stdout_filters);
  sup.stderr_filters = parse_filters(o.duplicate_stderr_filters);
  sup.attempt_dir = job.run_dir / fmt::format("attempt_{}", round.number);
  sup.grace = Duration(static_cast<std::int64_t>(o.grace_seconds * 1000));
  sup.monitor_interval = Duration(static_cast<std::int64_t>(o.monitor_interval * 1000));
  sup.unprefixed_rank0 = o.unprefixed_rank0;
  return sup;
}

}  // namespace

// The launchers' store and the run id first; then, each attempt: the round
// (step 1), the ranks (step 2), their supervision with the watch of the
// other nodes (step 3), and what its end means: done (step 4), interrupted,
// a re-form without a restart counted, a restart, or the job's failure.
int run_nodes(const RunOptions& o, const JobPlan& plan, int nproc, int signal_fd) {
  const bool single = !plan.elastic && plan.nodes.max == 1;
  const Deadline rendezvous_deadline = Deadline::after(plan.join_timeout);
  JobIdentity job;
  std::unique_ptr<TcpStoreServer> server;
  const std::shared_ptr<Store> control = control_store(o, plan, single, job, server, rendezvous_deadline, signal_fd);
  Store& store = *control;
  // How messages name the launchers' store.
  const std::string store_name = plan.etcd ? fmt::format("etcd at {}", o.rdzv_endpoint)
                                           : fmt::format("the store at {}:{}", job.store_addr, job.store_port);
  const std::string who = plan.elastic ? fmt::format("the node on host {}", host_name())
                                       : fmt::format("node {} (host {})", plan.node_rank, host_name());
  job.run_id = agree_run_id(store, o, plan, server != nullptr, job, who, rendezvous_deadline, signal_fd);
  // Unique to this launcher (unlike the run id, which every node shares and
  // a user may choose), so it names exactly this node's segments.
  job.shm_tag = random_hex(6);
  ScratchDirectory scratch;
  job.run_dir = (o.log_dir.empty() ? scratch.create() : std::filesystem::path(o.log_dir)) / job.run_id;
  std::unique_ptr<ElasticRendezvous> elastic;
  if (plan.elastic) elastic = start_elastic_rendezvous(store, o, plan, job, store_name, nproc, signal_fd);

  // A node brought back to a running job joins its latest attempt (restarts
  // and attempts go together in a fixed job), or takes the place of the node
  // it lost (node_takeover.h).
  // Under --on-rank-failure continue a node that stops beating is lost,
  // not failed: the others go on without it (no new round, elastic or
  // not), and a launcher that arrives later takes its place.
  const bool nodes_lost_in_place = !single && o.on_rank_failure == "continue";
  const int first_attempt = single || elastic ? 0
                                              : attempt_to_join(store, plan.node_rank, !nodes_lost_in_place,
                                                                Deadline::after(plan.join_timeout), signal_fd);
  // How long a launcher that arrives waits for the others to count a node
  // lost, to take its place: the keep-alive limit twice, and 5 s.
  const Duration wait_for_loss = 2 * continue_keep_alive(o).limit() + std::chrono::seconds(5);
  int failures = first_attempt;
  int last_world = -1;
  const std::vector<std::string> command =
      rank_command(o.program, EntryPoint{.module = o.module, .no_python = o.no_python, .run_path = o.run_path});
  for (int attempt = first_attempt;; ++attempt) {
    Round round;
    Endpoint master;
    RoundStore round_store;  // the ranks' store of this round, under etcd
    std::optional<NodeTakeover> takeover;
    try {
      if (nodes_lost_in_place && attempt == first_attempt) {
        takeover = elastic ? take_over_a_lost_node(store, *elastic, nproc, wait_for_loss, signal_fd)
                           : take_over_lost_node(store, plan.node_rank, plan.nodes.min, nproc, attempt,
                                                 wait_for_loss, signal_fd);
      }
      if (takeover) {
        round = takeover->round;
        std::fprintf(stderr,
                     "lockstep run: the job lost node %d and goes on without it; this launcher takes its place "
                     "(generation %d): its %d rank(s) join the running group at its next step boundary, fed from "
                     "their peers' memory\n",
                     round.node_rank, takeover->generation, nproc);
      } else if (elastic) {
        auto next = elastic->next_round();
        if (!next) {
          std::fprintf(stderr, "lockstep run: the job finished while this node waited to join it\n");
          return 0;
        }
        round = *next;
        if (nodes_lost_in_place) publish_elastic_node(store, round, nproc);
      } else {
        round = rendezvous_static(store, o, plan.node_rank, plan.nodes.min, nproc, attempt, signal_fd);
      }
      master = program_master(store, round, single, o.local_addr, signal_fd, Deadline::after(plan.join_timeout));
      if (plan.etcd) {
        round_store = open_round_store(store, round, master.host, env_string(env::kStoreToken),
                                       Deadline::after(plan.join_timeout), signal_fd);
        job.store_addr = round_store.host;
        job.store_port = round_store.port;
        job.token = round_store.token;
        if (takeover)
          for (int local = 0; local < nproc; ++local)
            tell_ranks_of_start(round_store, round, round.first_rank + local,
                                takeover->incarnations[static_cast<std::size_t>(local)]);
      }
    } catch (const Interrupted& e) {
      if (elastic) elastic->stop_beating();  // its connection is not a reader to wait for
      announce_interruption(store, server.get(), who, e, elastic ? elastic->interruption_key() : kInterruptedKey);
      throw;
    } catch (const PeerError&) {
      if (elastic) elastic->stop_beating();
      keep_store_for_readers(server.get());  // another launcher published why the nodes stop
      throw;
    }
    if (elastic || round.world_size != last_world)
      std::fprintf(stderr, "lockstep run: %d rank(s) on node %d of %d (world size %d), %s, run %s%s\n", nproc,
                   round.node_rank, round.nnodes, round.world_size,
                   plan.etcd ? fmt::format("rendezvous in {}, ranks' store {}:{}", store_name, job.store_addr,
                                           job.store_port).c_str()
                             : fmt::format("store {}:{} ({})", job.store_addr, job.store_port,
                                           store_protection(single, plan)).c_str(),
                   job.run_id.c_str(), elastic ? fmt::format(", round {}", round.number).c_str() : "");
    last_world = round.world_size;
    SupervisorOptions sup = supervisor_options(o, job, round);
    std::vector<RankProcess> ranks;
    ranks.reserve(static_cast<std::size_t>(nproc));
    for (int local = 0; local < nproc; ++local) {
      sup.rank_dirs.push_back(attempt_dir(job, round, local));
      std::filesystem::create_directories(sup.rank_dirs.back());
      std::filesystem::remove(sup.rank_dirs.back() / "error.json");  // an earlier job's, with this run id
      ranks.emplace_back(round.first_rank + local, command,
                         rank_env(o, round, nproc, local, job, master, failures,
                                  takeover ? takeover->incarnations[static_cast<std::size_t>(local)] : 0));
    }
    if (takeover) sup.incarnations = takeover->incarnations;
    const std::string failed_key = round_failed_key(round.number);
    StopReasons stop;
    if (!single)
      sup.remote_failure =
          watch_other_nodes(store, elastic.get(), plan, job, store_name, round, round_store, stop, nodes_lost_in_place);
    sup.continue_after_rank_failure = o.on_rank_failure == "continue";
    std::unique_ptr<NodeLossWatch> node_loss;
    if (nodes_lost_in_place) {
      NodeLossWatch::TellRanks tell_ranks;
      if (plan.etcd)
        tell_ranks = [&round_store](const std::string& key, const std::string& value) {
          update_round_ranks(round_store, key, value);
        };
      node_loss = std::make_unique<NodeLossWatch>(store, round, nproc, continue_keep_alive(o),
                                                  takeover ? takeover->generation : 0, std::move(tell_ranks));
      sup.remote_failure = [watch = std::move(sup.remote_failure), &node_loss,
                            &stop]() -> std::optional<std::string> {
        if (auto cut_off = node_loss->poll()) {
          stop.store_lost = true;  // the others go on: this node stops, and does not restart
          return cut_off;
        }
        return watch();
      };
    }
    std::unique_ptr<SilentNodeWatch> silent_nodes;
    if (!single && !elastic && !nodes_lost_in_place) {
      // Under restart, torchrun's keep-alive (KeepAlive's defaults).
      silent_nodes = std::make_unique<SilentNodeWatch>(store, round, keep_alive_of(o, KeepAlive{}));
      sup.remote_failure = [watch = std::move(sup.remote_failure), &silent_nodes, &store,
                            &failed_key]() -> std::optional<std::string> {
        if (auto why = watch()) return why;
        auto silent = silent_nodes->poll();
        if (!silent) return std::nullopt;
        try {  // every node stops, whether or not it has looked yet
          const std::string first = store.compare_set(failed_key, "", *silent);
          if (first != *silent) return "another node reported: " + first;
        } catch (const Error&) {
          // The store's trouble: the round's watch says so at its next look.
        }
        return silent;
      };
    }
    if (sup.continue_after_rank_failure) {
      // The survivors need not wait for a rank the launcher saw end
      // (ProcessGroup::shrink reads this key).
      sup.rank_lost = [&](int rank, int incarnation) {
        const std::string key = launcher_lost_key(round.number, rank, incarnation);
        try {
          store.set(key, "ended");
          if (plan.etcd) tell_round_ranks(round_store, key, "ended");
        } catch (const Error& e) {
          std::fprintf(stderr, "lockstep run: could not tell the ranks that rank %d ended (%s)\n", rank, e.what());
        }
      };
      sup.dropped = [&](int rank, int incarnation) {
        const std::string key = launcher_dropped_key(round.number, rank, incarnation);
        return plan.etcd ? round_store_has(round_store, key) : store.check({key});
      };
      sup.replacements = o.max_replacements;
      sup.next_incarnation = [&](int rank) {
        const int incarnation = static_cast<int>(store.add(launcher_starts_key(round.number, rank), 1));
        if (plan.etcd) tell_ranks_of_start(round_store, round, rank, incarnation);
        return incarnation;
      };
      sup.joined = [&](int rank, int incarnation) {
        const std::string key = launcher_joined_key(round.number, rank, incarnation);
        return plan.etcd ? round_store_has(round_store, key) : store.check({key});
      };
      sup.start_replacement = [&](std::size_t local, int incarnation) {
        const int l = static_cast<int>(local);
        return RankProcess(round.first_rank + l, command,
                           rank_env(o, round, nproc, l, job, master, failures, incarnation));
      };
    }
    AttemptResult result = supervise(ranks, signal_fd, sup);
    remove_leftover_segments(job.shm_tag);
    merge_rank_traces(round, nproc);
    if (result.none_left && node_loss && result.interrupted_by == 0) {
      try {
        await_outcome_without_local_ranks(store, round, signal_fd, sup.remote_failure, result);
      } catch (const Interrupted&) {
        store.compare_set(failed_key, "", fmt::format("{} was interrupted", who));
        throw;
      }
    }

    if (result.ok) {
      if (node_loss) node_loss->mark_finished();
      if (!single) {
        // "done" last: once every node has said it, the store's host leaves.
        if (elastic) elastic->mark_finished();
        if (elastic) elastic->mark_done(round);
        // Not silent from now on; nor is a launcher started again for this
        // node afterwards to take its end for a death (attempt_to_join).
        if (silent_nodes) silent_nodes->mark_finished();
        store.add(node_keys::done(round.number), 1);
        // Under etcd, node 0 of the round hosts its ranks' store instead.
        if ((server || round_store.server) && node_loss)
          // A node that dies meanwhile is lost, not waited for (and one
          // taken over beats on NodeLossWatch's counter, not the elastic one).
          wait_for_nodes(store, round.nnodes, round.number, signal_fd, [&] { return node_loss->poll(); });
        else if ((server || round_store.server) && elastic)
          wait_for_nodes(store, round.nnodes, round.number, signal_fd, [&] { return elastic->silent_before_done(round); });
        else if (server)
          wait_for_nodes(store, round.nnodes, round.number, signal_fd);
      }
      return 0;
    }
    if (result.interrupted_by != 0) {
      if (!single) store.compare_set(failed_key, "", fmt::format("{} was interrupted", who));
      return 128 + result.interrupted_by;
    }
    if (stop.store_unanswered) {
      // Not a failure of the ranks: no restart is counted (as a node joining).
      std::fprintf(stderr, "lockstep run: stopped this node's %zu rank(s): %s\n", ranks.size(),
                   result.first_failure->reported_by.c_str());
      if (!reach_store_again(store, job, plan.join_timeout, signal_fd)) return 1;
      continue;  // joins the next round, or learns that the job is over
    }
    // A node waiting to join stops this attempt too when a peer's ranks,
    // stopped for it a moment earlier, made ours fail first.
    if (elastic && !stop.regroup && !stop.store_lost && round.nnodes < plan.nodes.max) {
      try {
        stop.regroup = elastic->nodes_waiting(round) > 0;
      } catch (const Error&) {
        // The store is gone: handled as a failure below.
      }
    }
    // So does a node that stopped beating: our ranks may fail first (they
    // were in a collective with ranks another launcher stopped for it).
    if (elastic && !stop.regroup && !stop.store_lost && !stop.round_over) {
      try {
        if (auto lost = elastic->lost_node(round)) {
          const RankFailure& f = *result.first_failure;
          print_failure(f, round.node_rank, attempt, ranks.size() - (f.reported_by.empty() ? 1 : 0));
          std::fprintf(stderr, "lockstep run: meanwhile %s; re-forming the group without it\n", lost->c_str());
          continue;
        }
      } catch (const Error&) {
        // The store is gone: handled as a failure below.
      }
    }
    if (stop.round_over && !stop.regroup && !stop.store_lost) {
      // Not a failure of the ranks: no restart is counted (as a node joining).
      std::fprintf(stderr, "lockstep run: stopped this node's %zu rank(s): %s\n", ranks.size(),
                   result.first_failure->reported_by.c_str());
      continue;  // joins the next round, or learns that the job is over
    }
    if (stop.regroup) {
      std::fprintf(stderr, "lockstep run: a new node is waiting to join; stopped this node's %zu rank(s) to re-form the group\n",
                   ranks.size());
      elastic->open_next_round(round);
      continue;
    }
    const RankFailure& f = *result.first_failure;
    const bool failed_here = !single && f.reported_by.empty();
    if (failed_here) {
      try {
        store.set(node_failed_key(round.number, round.node_rank), failure_line(f, round.node_rank));
        store.compare_set(failed_key, "", failure_line(f, round.node_rank));
      } catch (const TimeoutError& e) {
        if (!elastic) throw;
        stop.store_unanswered = true;  // cut off from it, perhaps for a while: reached again below
        std::fprintf(stderr, "lockstep run: %s did not answer in time (%s)\n", store_name.c_str(), e.what());
      } catch (const Error& e) {
        if (!elastic) throw;
        stop.store_lost = true;  // its host died with the others' ranks; say why this node stops
        std::fprintf(stderr, "lockstep run: %s is gone (%s); the job cannot go on without it\n", store_name.c_str(),
                     e.what());
      }
    }
    print_failure(f, round.node_rank, attempt, ranks.size() - (f.reported_by.empty() ? 1 : 0));
    if (result.could_not_go_on) print_fallback_to_restart(*result.could_not_go_on, f, failures, o.max_restarts);
    if (failed_here && !stop.store_lost) print_other_nodes_failures(store, round, std::chrono::seconds(1));
    if (failures >= o.max_restarts || stop.store_lost) {
      // The failed rank's own code; a failure on another node has none here.
      return f.reported_by.empty() ? f.status.as_exit_code() : 1;
    }
    ++failures;
    if (stop.store_unanswered) {
      // The others re-form without this node meanwhile: it joins their next round.
      if (!reach_store_again(store, job, plan.join_timeout, signal_fd)) return f.status.as_exit_code();
      std::fprintf(stderr, "lockstep run: restart %d of %d: joining the job's next round\n", failures, o.max_restarts);
      continue;
    }
    std::fprintf(stderr, "lockstep run: restarting all ranks (restart %d of %d)%s\n", failures, o.max_restarts,
                 elastic ? " with the nodes that are left or join" : "");
    if (elastic) elastic->open_next_round(round);
  }
}

}  // namespace lockstep::cli
