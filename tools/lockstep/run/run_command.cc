// `lockstep run`: options, the store, launcher rendezvous across nodes, and
// the attempt loop with restarts. See run_command.h and docs/launcher.md.
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
#include "run/run_command.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <lockstep_option_checks/option_checks.h>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/host.h"
#include "common/launcher_keys.h"
#include "common/socket.h"
#include "diag/tracer.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "comm/launcher_cleanup.h"
#include "run/elastic_rendezvous.h"
#if LOCKSTEP_WITH_ETCD
#include "run/etcd_store.h"
#endif
#include "run/interruption.h"
#include "run/round_store.h"
#include "lockstep/affinity.h"
#include "run/run_arguments.h"
#include "run/scratch_directory.h"
#include "run/slurm_defaults.h"
#include "store/store_token.h"
#include "run/supervisor.h"

namespace lockstep::cli {
namespace {

int resolve_nproc(const std::string& text) {
  if (text == "auto") return usable_cores();
  // Bounded before the narrowing to int, so 4294967297 is not taken as 1.
  constexpr std::int64_t kMaxPerNode = 1 << 16;
  const auto n = parse_int(text);
  if (!n || *n < 1 || *n > kMaxPerNode)
    throw ConfigError(fmt::format("--nproc-per-node '{}' is not a positive number up to {} or 'auto'", text,
                                  kMaxPerNode));
  return static_cast<int>(*n);
}

// The signals the launcher handles, delivered through a signalfd.
UniqueFd block_signals(const std::vector<int>& handled) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int sig : handled) sigaddset(&set, sig);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  return UniqueFd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
}

// Agrees with the other launchers on the world of attempt `attempt` of a
// job with a fixed node count (--nnodes N, --node-rank K).
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
  const std::string me = fmt::format("host {} (pid {})", host_name(), ::getpid());
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

// Where every rank finds the store, and what identifies the job.
struct JobIdentity {
  std::filesystem::path run_dir;  // <log dir or a temporary one>/<run id>: attempts' logs and error files
  std::string store_addr;
  int store_port = 0;
  std::string run_id;
  std::string token;
  std::string shm_tag;
};

// After the store did not answer in time (a partition, a switch that
// reboots, the store's host down): waits up to `within` (--rdzv-timeout)
// for it to accept connections again, saying so. False: it did not; the
// job cannot go on without it.
bool reach_store_again(Store& control, const JobIdentity& job, Duration within, int signal_fd) {
#if LOCKSTEP_WITH_ETCD
  if (auto* etcd = dynamic_cast<EtcdStore*>(&control)) {
    std::fprintf(stderr, "lockstep run: trying to reach etcd at %s again for up to %.0f s (--rdzv-timeout), then "
                 "joining the job's next round\n", etcd->endpoints_text().c_str(), seconds(within));
    const Deadline deadline = Deadline::after(within);
    while (!etcd->reachable(std::chrono::seconds(1))) {
      throw_if_interrupted(signal_fd, "etcd to answer again");
      if (deadline.expired()) {
        std::fprintf(stderr, "lockstep run: no member of etcd at %s answered for %.0f s; the job cannot go on "
                     "without it\n", etcd->endpoints_text().c_str(), seconds(within));
        return false;
      }
    }
    return true;
  }
#endif
  const std::string store = format_endpoint(job.store_addr, static_cast<std::uint16_t>(job.store_port));
  std::fprintf(stderr, "lockstep run: trying to reach the store at %s again for up to %.0f s (--rdzv-timeout), "
               "then joining the job's next round\n", store.c_str(), seconds(within));
  const Deadline deadline = Deadline::after(within);
  try {
    wait_for_listener(job.store_addr, static_cast<std::uint16_t>(job.store_port), deadline, signal_fd);
  } catch (const ConfigError&) {
    std::fprintf(stderr, "lockstep run: the store at %s did not answer for %.0f s; the job cannot go on without it\n",
                 store.c_str(), seconds(within));
    return false;
  }
  std::fprintf(stderr, "lockstep run: the store at %s answers again after %.1f s\n", store.c_str(),
               seconds(within) - seconds(deadline.remaining()));
  return true;
}

// torchrun's layout: <run dir>/attempt_<k>/<local rank>/ holds that rank's
// stdout.log, stderr.log and error.json; k is the round, which every node
// of the job shares (restarts and re-forms alike).
std::filesystem::path attempt_dir(const JobIdentity& job, const Round& round, int local) {
  return job.run_dir / fmt::format("attempt_{}", round.number) / std::to_string(local);
}

// MASTER_ADDR and MASTER_PORT for a torch.distributed program, as torchrun's
// c10d rendezvous gives them: node 0's address and a port free there when
// the round starts, published in the store for the other nodes. As under
// torchrun, another process may take the port before the program's rank 0
// listens on it; a fresh one each round keeps that window short.
Endpoint program_master(Store& store, const Round& round, bool single, const std::string& local_addr, int signal_fd,
                        Deadline deadline) {
  const std::string key = fmt::format("launcher/{}/master", round.number);
  if (round.node_rank == 0) {
    Endpoint master;
    master.host = single ? "127.0.0.1" : !local_addr.empty() ? local_addr : store.advertised_address();
    if (master.host.empty()) master.host = host_name();
    master.port = local_port(listen_tcp(single ? "127.0.0.1" : "", 0).fd());
    if (!single) store.set(key, format_endpoint(master.host, static_cast<std::uint16_t>(master.port)));
    return master;
  }
  if (!wait_for_keys(store, {key}, deadline, signal_fd, "node 0 to choose MASTER_ADDR and MASTER_PORT"))
    throw ConfigError(fmt::format("node 0 did not publish MASTER_ADDR/MASTER_PORT for round {} in time; is its "
                                  "launcher still running?",
                                  round.number));
  return parse_endpoint(store.get(key));
}

// The environment torchrun gives a worker (plus lockstep's own), for local
// rank `local` of `round`. `failures`: restarts after failures so far
// (torchrun's TORCHELASTIC_RESTART_COUNT); LOCKSTEP_RESTART_COUNT is the
// round, which every node shares and which names the ranks' store keys.
std::map<std::string, std::string> rank_env(const RunOptions& o, const Round& round, int nproc, int local,
                                            const JobIdentity& job, const Endpoint& master, int failures) {
  const std::string rank = std::to_string(round.first_rank + local);
  const std::string world = std::to_string(round.world_size);
  std::map<std::string, std::string> env{
      {env::kRank, rank},
      {env::kLocalRank, std::to_string(local)},
      {env::kWorldSize, world},
      {env::kLocalWorldSize, std::to_string(nproc)},
      {env::kGroupRank, std::to_string(round.node_rank)},
      {env::kGroupWorldSize, std::to_string(round.nnodes)},
      {env::kRoleRank, rank},  // one role: ranks within it are the global ranks
      {env::kRoleWorldSize, world},
      {env::kRoleName, o.role},
      // MASTER_* are the program's, as under torchrun's c10d rendezvous: a
      // torch.distributed rank 0 hosts its own store there. lockstep's
      // ranks find the launcher's store by LOCKSTEP_STORE_*.
      {env::kMasterAddr, master.host},
      {env::kMasterPort, std::to_string(master.port)},
      {env::kStoreAddr, job.store_addr},
      {env::kStorePort, std::to_string(job.store_port)},
      {env::kRunId, job.run_id},
      {env::kRestartCount, std::to_string(round.number)},
      {env::kShmTag, job.shm_tag},
      {env::kTorchelasticRunId, job.run_id},
      {env::kTorchelasticRestartCount, std::to_string(failures)},
      {env::kTorchelasticMaxRestarts, std::to_string(o.max_restarts)},
      {env::kTorchelasticUseAgentStore, "False"},
      {env::kTorchelasticErrorFile, (attempt_dir(job, round, local) / "error.json").string()},
  };
  if (!job.token.empty()) env[env::kStoreToken] = job.token;
  if (!o.backend.empty()) env[env::kBackend] = o.backend;
  // As torchrun does: several ranks per node each using every core for
  // their math would oversubscribe the machine.
  if (nproc > 1 && !env_string("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  return env;
}

void print_failure(const RankFailure& f, int node_rank, int attempt, std::size_t others) {
  if (!f.reported_by.empty()) {
    std::fprintf(stderr, "lockstep run: stopped this node's %zu rank(s): %s\n", others, f.reported_by.c_str());
    return;
  }
  if (f.left_early >= 0) {
    // The failure is most likely the consequence: name the rank that left.
    std::fprintf(stderr, "lockstep run: rank %d exited cleanly (exit code 0) while the other ranks still ran, after %.1f s; then rank %d failed: %s after %.1f s (node %d, attempt %d); stopped the other %zu rank(s) on this node\n",
                 f.left_early, f.left_early_seconds, f.rank, f.status.describe().c_str(), f.seconds, node_rank, attempt,
                 others);
    std::fprintf(stderr, "lockstep run: likely cause: rank %d left early. A rank that exits before the others has usually issued fewer collectives (e.g. fewer steps or batches), and the ranks still waiting for it fail; make every rank run the same steps\n",
                 f.left_early);
  } else {
    std::fprintf(stderr, "lockstep run: rank %d failed first: %s after %.1f s (node %d, attempt %d); stopped the other %zu rank(s) on this node\n",
                 f.rank, f.status.describe().c_str(), f.seconds, node_rank, attempt, others);
  }
  if (!f.error_file.empty())
    std::fprintf(stderr, "lockstep run: rank %d recorded its error (%s): %s\n", f.rank, f.error_file_path.c_str(),
                 f.error_file.c_str());
  if (!f.last_stderr.empty()) {
    std::fprintf(stderr, "lockstep run: last lines of rank %d's stderr:\n", f.rank);
    for (const auto& line : f.last_stderr) std::fprintf(stderr, "  | %s\n", line.c_str());
  }
}

std::string failure_line(const RankFailure& f, int node_rank) {
  if (f.left_early >= 0)
    return fmt::format("rank {} on node {} failed: {}, after rank {} exited cleanly while the others still ran (the "
                       "likely cause: it left early)",
                       f.rank, node_rank, f.status.describe(), f.left_early);
  if (!f.error_file.empty())
    return fmt::format("rank {} on node {} failed: {}: {}", f.rank, node_rank, f.status.describe(), f.error_file);
  return fmt::format("rank {} on node {} failed: {}", f.rank, node_rank, f.status.describe());
}

// Where each node's launcher reports its own ranks' failure in a round
// (besides the first report of the job, which the others stop for).
std::string node_failed_key(int round, int node_rank) { return fmt::format("launcher/{}/failed/{}", round, node_rank); }

// The failures the other nodes' launchers report for this round, printed as
// they arrive, for up to `patience`: each host's log then names every
// node's failure (a rank killed on one host makes its peers on the others
// fail too, and which node's report reaches the store first is a race).
void print_other_nodes_failures(Store& store, const Round& round, Duration patience) {
  std::vector<bool> seen(static_cast<std::size_t>(round.nnodes), false);
  seen[static_cast<std::size_t>(round.node_rank)] = true;
  const Deadline give_up = Deadline::after(patience);
  try {
    for (;;) {
      for (int n = 0; n < round.nnodes; ++n) {
        const std::string key = node_failed_key(round.number, n);
        if (seen[static_cast<std::size_t>(n)] || !store.check({key})) continue;
        std::fprintf(stderr, "lockstep run: another node reported: %s\n", store.get(key).c_str());
        seen[static_cast<std::size_t>(n)] = true;
      }
      if (std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }) || give_up.expired()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const Error&) {
    // The store's host has gone: what it had is printed.
  }
}

// The store's host waits for every node to finish before exiting.
void wait_for_nodes(Store& store, int nnodes, int round, int signal_fd,
                    const std::function<std::optional<std::string>()>& gone = nullptr) {
  const std::string done = fmt::format("launcher/{}/done", round);
  const std::string failed = fmt::format("launcher/{}/failed", round);
  while (store.add(done, 0) < nnodes && !store.check({failed})) {
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

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunOptions& o) {
  auto* run = app.add_subcommand("run", "Start a program on several processes (and nodes), as torchrun does");
  run->add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node, "Processes on this node: a number or 'auto' (one per core)")->capture_default_str();
  run->add_option("--nnodes", o.nnodes, "Number of nodes, or MIN:MAX for an elastic job")->capture_default_str();
  run->add_option("--node-rank,--node_rank", o.node_rank, "This node's index, 0..nnodes-1 (fixed --nnodes only; default 0)")->check(option_checks::non_negative_count());
  run->add_option("--master-addr,--master_addr", o.master_addr, "Address of the node that hosts the store")->capture_default_str();
  run->add_option("--master-port,--master_port", o.master_port, "Store port (0: pick a free one; single node only)")->capture_default_str()->check(CLI::Range(0, 65535));
  run->add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint, "host[:port] of the store (default port 29400); the node with that address hosts it. etcd: the members, host[:2379][,host[:2379]...]");
  run->add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend, "static (fixed --node-rank), c10d (node ranks from the rendezvous; implied by --nnodes MIN:MAX) or etcd (the rendezvous in an etcd cluster, which outlives any node)");
  run->add_option("--rdzv-id,--rdzv_id,--run-id", o.run_id, "Job identifier, the same on every node (default: random on one node)");
  run->add_option("--rdzv-conf,--rdzv_conf", o.rdzv_conf, "join_timeout=S,last_call_timeout=S,keep_alive_interval=S,keep_alive_max_attempt=N (a node silent for S x N is gone; default 5 x 3); etcd: protocol=https,cacert=F,cert=F,key=F,username=U (password in LOCKSTEP_ETCD_PASSWORD)");
  run->add_option("--rdzv-timeout", o.rendezvous_seconds, "Seconds to wait for the other nodes' launchers")->capture_default_str()->check(option_checks::number_in(0.001, 604800));
  run->add_flag("--standalone", o.standalone, "Single node on this host with a free port (the default for one node)");
  run->add_option("--max-restarts,--max_restarts", o.max_restarts, "Restart all ranks up to this many times after a failure")->capture_default_str()->check(option_checks::non_negative_count());
  run->add_option("--monitor-interval,--monitor_interval", o.monitor_interval, "Seconds between looks at the other nodes (failures, nodes waiting to join)")->capture_default_str()->check(option_checks::number_in(0.01, 60));
  run->add_option("--role", o.role, "ROLE_NAME of the ranks")->capture_default_str();
  run->add_option("--log-dir,--log_dir", o.log_dir, "Also write each rank's output to DIR/<run id>/attempt_<k>/<local rank>/{stdout,stderr}.log");
  run->add_option("--tee,-t", o.tee, "Also copy these streams to the --log-dir files: 0 none, 1 stdout, 2 stderr, 3 both, or local_rank:n,...");
  run->add_option("--redirects,-r", o.redirects, "Send these streams to the --log-dir files only (same values as --tee)");
  run->add_flag("--no-prefix", o.no_prefix, "Do not prefix output lines with [rank]");
  run->add_flag("--unprefixed-rank0", o.unprefixed_rank0, "Show rank 0's output without a prefix");
  run->add_option("--grace-period", o.grace_seconds, "Seconds between SIGTERM and SIGKILL when stopping ranks")->capture_default_str()->check(option_checks::number_in(0, 3600));
  run->add_option("--backend", o.backend, "Sets LOCKSTEP_BACKEND for the ranks: auto, tcp, shm, hier, mpi, nccl");
  run->add_flag("-m,--module", o.module, "Run the program as a Python module (python3 -m), as torchrun -m");
  run->add_flag("--no-python,--no_python", o.no_python, "Execute the program as it is, even a .py file (without -m)");
  run->add_flag("--run-path,--run_path", o.run_path, "Run the Python file through runpy.run_path, as torchrun --run-path");
  run->add_option("--start-method,--start_method", o.start_method, "Accepted for torchrun's sake (spawn, fork, forkserver): every rank is a fresh process")
      ->check(CLI::IsMember({"spawn", "fork", "forkserver"}));
  run->add_option("--local-ranks-filter,--local_ranks_filter", o.local_ranks_filter, "Show only these local ranks' output on the console (0,1,...); the log files keep every rank's");
  run->add_option("--duplicate-stdout-filters,--duplicate_stdout_filters", o.duplicate_stdout_filters, "Also copy stdout lines containing any of these (a,b; ,, for a comma) to DIR/<run id>/attempt_<k>/filtered_stdout.log");
  run->add_option("--duplicate-stderr-filters,--duplicate_stderr_filters", o.duplicate_stderr_filters, "The same for stderr (filtered_stderr.log)");
  run->add_option("--local-addr,--local_addr", o.local_addr, "This node's address for the program's MASTER_ADDR when it is node 0 (default: the address that reaches the store)");
  run->add_option("--signals-to-handle,--signals_to_handle", o.signals_to_handle, "Signals that stop the ranks (forwarded to them; SIGHUP as SIGTERM)")->capture_default_str();
  run->add_flag("--virtual-local-rank,--virtual_local_rank", o.virtual_local_rank, "Refused: see docs/launcher.md");
  run->add_option("--numa-binding,--numa_binding", o.numa_binding, "Refused: see docs/launcher.md");
  run->add_option("--logs-specs,--logs_specs", o.logs_specs, "Refused: see docs/launcher.md");
  run->add_option("--event-log-handler,--event_log_handler", o.event_log_handler, "Refused: see docs/launcher.md");
  run->add_option("program", o.program, "The program and its arguments (a .py file runs with python3 -u)")->required()->expected(-1);
  run->footer(
      "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,\n"
      "ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_* as under torchrun. When a rank fails, the others\n"
      "are stopped; with --max-restarts the job restarts, and with --nnodes MIN:MAX it goes on with the nodes that\n"
      "are left (or that joined). The program's own options follow its name; `--` before it is optional.");
  return run;
}

namespace {

// What run_job() resolved from the options.
struct JobPlan {
  NodeRange nodes;
  bool elastic = false;
  bool etcd = false;  // the rendezvous in etcd (--rdzv-backend etcd)
  std::string store_host;  // the store's address
  int store_port = 0;
  int node_rank = 0;  // fixed --nnodes only
  Duration join_timeout{0};
  Duration last_call{0};
};

// torchrun options that do not carry over, each refused with its reason
// rather than accepted and ignored.
void refuse_unsupported(const RunOptions& o) {
  if (o.virtual_local_rank)
    throw ConfigError("--virtual-local-rank is not supported: it gives every rank LOCAL_RANK=0, and lockstep's ranks "
                      "place themselves by it (cores, shared memory); give each rank its GPU with LOCAL_RANK instead");
  if (!o.numa_binding.empty())
    throw ConfigError("--numa-binding is not supported: lockstep does not read the GPUs' NUMA placement; ranks pin "
                      "themselves to cores with lockstep::pin_to_core_of_local_rank, or run the launcher under numactl");
  if (!o.logs_specs.empty())
    throw ConfigError("--logs-specs names a Python plug-in of torchrun's; lockstep's log layout is fixed (--log-dir, "
                      "docs/launcher.md)");
  if (!o.event_log_handler.empty())
    throw ConfigError("--event-log-handler names a Python plug-in of torchrun's; lockstep's launcher logs to stderr");
}

JobPlan plan_job(const RunOptions& o) {
  JobPlan plan;
  plan.nodes = parse_nnodes(o.nnodes);
  const std::string& backend = o.rdzv_backend;
  // etcd-v2 is torchrun's other name for its etcd rendezvous.
  plan.etcd = backend == "etcd" || backend == "etcd-v2";
  if (!backend.empty() && backend != "static" && backend != "c10d" && !plan.etcd)
    throw ConfigError(fmt::format("--rdzv-backend '{}' is not known; use static, c10d or etcd", backend));
#if !LOCKSTEP_WITH_ETCD
  if (plan.etcd)
    throw ConfigError("--rdzv-backend etcd: this lockstep was built without libcurl, which it speaks to etcd with; "
                      "install libcurl4-openssl-dev and build again, or use --rdzv-backend c10d");
#endif
  plan.elastic = plan.nodes.elastic() || backend == "c10d" || plan.etcd;
  if (plan.nodes.elastic() && o.rdzv_backend == "static")
    throw ConfigError(fmt::format("--nnodes {} needs the c10d rendezvous; drop --rdzv-backend static", o.nnodes));
  if (plan.elastic && o.node_rank >= 0)
    throw ConfigError("in an elastic job the rendezvous numbers the nodes; drop --node-rank");
  plan.node_rank = std::max(0, o.node_rank);
  if (!plan.elastic && plan.node_rank >= plan.nodes.min)
    throw ConfigError(fmt::format("--node-rank {} is not below --nnodes {}", plan.node_rank, plan.nodes.min));
  const bool several = plan.elastic || plan.nodes.max > 1;
  if (o.standalone && several) throw ConfigError("--standalone is for a single node; drop it or --nnodes");
  plan.store_host = o.master_addr;
  plan.store_port = o.master_port;
  const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);
  if (plan.etcd) {
    if (o.rdzv_endpoint.empty())
      throw ConfigError("--rdzv-backend etcd needs --rdzv-endpoint: the etcd cluster's members, "
                        "host:2379[,host:2379...]");
    if (o.run_id.empty())
      throw ConfigError("--rdzv-backend etcd needs --rdzv-id: it names the job's keys in etcd, and every node must "
                        "give the same one");
  } else if (conf.names_etcd_keys()) {
    throw ConfigError("--rdzv-conf protocol, cacert, cert, key and username are for --rdzv-backend etcd");
  } else if (!o.rdzv_endpoint.empty()) {
    const Endpoint e = parse_endpoint(o.rdzv_endpoint);
    plan.store_host = e.host;
    plan.store_port = e.port > 0 ? e.port : 29400;  // torchrun's default
  }
  if (several && !plan.etcd && plan.store_port == 0)
    throw ConfigError("several nodes need a fixed --master-port or --rdzv-endpoint host:port (the same on every node)");
  const double join = conf.join_timeout >= 0 ? conf.join_timeout : o.rendezvous_seconds;
  const double last_call = conf.last_call_timeout >= 0 ? conf.last_call_timeout : o.last_call_seconds;
  plan.join_timeout = Duration(static_cast<std::int64_t>(join * 1000));
  plan.last_call = Duration(static_cast<std::int64_t>(last_call * 1000));
  if ((!o.tee.empty() || !o.redirects.empty()) && o.log_dir.empty())
    throw ConfigError("--tee and --redirects write each rank's streams to files under --log-dir; add --log-dir DIR");
  if ((!o.duplicate_stdout_filters.empty() || !o.duplicate_stderr_filters.empty()) && o.log_dir.empty())
    throw ConfigError("--duplicate-stdout-filters and --duplicate-stderr-filters write files under --log-dir; add "
                      "--log-dir DIR");
  refuse_unsupported(o);
  parse_local_ranks(o.local_ranks_filter);  // checks the values now, before any rank starts
  parse_signals(o.signals_to_handle);
  stream_mask(o.tee, 0, "--tee");
  stream_mask(o.redirects, 0, "--redirects");
  return plan;
}

int run_nodes(const RunOptions& o, const JobPlan& plan, int nproc, int signal_fd);

}  // namespace

int run_job(const RunOptions& given) {
  std::string slurm_note;
  const RunOptions o = with_slurm_defaults(given, environment_lookup, &slurm_note);
  if (!slurm_note.empty()) std::fprintf(stderr, "lockstep run: %s\n", slurm_note.c_str());
  const JobPlan plan = plan_job(o);
  if (!o.log_dir.empty()) std::filesystem::create_directories(o.log_dir);
  const int nproc = resolve_nproc(o.nproc_per_node);
  UniqueFd signals = block_signals(parse_signals(o.signals_to_handle));
  try {
    return run_nodes(o, plan, nproc, signals.fd());
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "lockstep run: %s\n", e.what());
    return 128 + e.signal();
  }
}

namespace {

// The store: hosted by node 0 of a fixed job, or in an elastic job by the
// launcher that can listen on the endpoint's address (the first one there).
// Every other launcher is a client.
std::unique_ptr<TcpStoreServer> host_store(const JobPlan& plan, bool single, const TcpStoreOptions& options) {
  if (single) return std::make_unique<TcpStoreServer>("127.0.0.1", static_cast<std::uint16_t>(plan.store_port), options);
  if (!plan.elastic) {
    if (plan.node_rank != 0) return nullptr;
    // Several nodes with a loopback address are all on this host (tests).
    const std::string listen = is_loopback_host(plan.store_host) ? plan.store_host : std::string();
    return std::make_unique<TcpStoreServer>(listen, static_cast<std::uint16_t>(plan.store_port), options);
  }
  try {
    return std::make_unique<TcpStoreServer>(plan.store_host, static_cast<std::uint16_t>(plan.store_port), options);
  } catch (const ConfigError&) {
    return nullptr;  // not this host's address, or another launcher here hosts it
  }
}

// The token: random on one node. Several nodes must share one without
// talking first, and nothing they are all given is secret (the endpoint and
// --rdzv-id are on every command line): so a store other hosts can reach
// takes the user's LOCKSTEP_STORE_TOKEN or does not start. Launchers that
// are all on this host (a loopback endpoint) derive one, which keeps out
// other jobs; only this host's users could compute it.
std::string store_token(const RunOptions& o, const JobPlan& plan, bool single) {
  const auto user = env_string(env::kStoreToken);
  if (single) return user.value_or(random_hex(16));
  if (user) return *user;
  const std::string endpoint = format_endpoint(plan.store_host, static_cast<std::uint16_t>(plan.store_port));
  if (!is_loopback_host(plan.store_host))
    throw ConfigError(fmt::format(
        "the store at {} is reachable from other hosts and nothing would protect it: set LOCKSTEP_STORE_TOKEN to "
        "one secret on every node, e.g. `export LOCKSTEP_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' "
        "\\n')` where you start the job (a token derived from the endpoint and --rdzv-id, which every command line "
        "shows, would let anyone who reads them in)",
        endpoint));
  const std::string facts = !o.run_id.empty() ? "id/" + o.run_id : fmt::format("endpoint/{}/nnodes/{}", endpoint, o.nnodes);
  return shared_store_token(std::nullopt, facts);
}

// The one line that says what protects the store.
std::string store_protection(bool single, const JobPlan& plan) {
  if (single) return "loopback only, random token";
  if (env_string(env::kStoreToken)) return "protected by LOCKSTEP_STORE_TOKEN";
  return is_loopback_host(plan.store_host) ? "loopback only, token derived from the job" : "";
}

// When the nodes stop during the rendezvous, the launcher hosting the store
// keeps it up a moment (while others are connected, 2 s at most) so they
// can read why.
void keep_store_for_readers(TcpStoreServer* server) {
  if (!server) return;
  const Deadline linger = Deadline::after(std::chrono::seconds(2));
  while (server->num_clients() > 1 && !linger.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

// After a signal during the rendezvous: tell the other launchers why.
void announce_interruption(Store& store, TcpStoreServer* server, const std::string& who, const Interrupted& e,
                           const std::string& key = kInterruptedKey) {
  if (key.empty()) return;  // nobody waits for this launcher
  publish_interruption(store, fmt::format("{} was interrupted: {}", who, e.what()), key);
  keep_store_for_readers(server);
}

#if LOCKSTEP_WITH_ETCD
// The launchers' store in etcd: every key of the job under
// /lockstep/<rdzv-id>/, on the job's lease. Waits for a member to answer
// until `deadline` (the join timeout), saying so.
std::shared_ptr<EtcdStore> connect_etcd(const RunOptions& o, Deadline deadline, int signal_fd) {
  const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);
  EtcdOptions options;
  bool https = conf.protocol == "https";
  options.endpoints = parse_etcd_endpoints(o.rdzv_endpoint, &https);
  options.https = https;
  options.prefix = fmt::format("/lockstep/{}/", o.run_id);
  options.cacert = conf.cacert;
  options.cert = conf.cert;
  options.key = conf.key;
  options.username = conf.username;
  if (!conf.username.empty()) {
    const auto password = env_string("LOCKSTEP_ETCD_PASSWORD");
    if (!password)
      throw ConfigError(fmt::format("--rdzv-conf username={} needs its password in LOCKSTEP_ETCD_PASSWORD (kept "
                                    "off the command line, which every user of the host can read)",
                                    conf.username));
    options.password = *password;
  }
  bool said = false;
  for (;;) {
    throw_if_interrupted(signal_fd, "etcd to answer");
    try {
      return std::make_shared<EtcdStore>(options);
    } catch (const TimeoutError& e) {
      if (deadline.expired())
        throw ConfigError(fmt::format("etcd did not answer within the join timeout (--rdzv-timeout): {}; start "
                                      "etcd there or correct --rdzv-endpoint",
                                      e.what()));
      if (!said) std::fprintf(stderr, "lockstep run: waiting for etcd at %s\n", o.rdzv_endpoint.c_str());
      said = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }
}
#endif

// The launchers' store: etcd's, or a TcpStore, hosted by this launcher
// when it is the one at the endpoint (`server`).
std::shared_ptr<Store> control_store(const RunOptions& o, const JobPlan& plan, bool single, JobIdentity& job,
                                     std::unique_ptr<TcpStoreServer>& server, Deadline deadline, int signal_fd) {
#if LOCKSTEP_WITH_ETCD
  if (plan.etcd) return connect_etcd(o, deadline, signal_fd);
#endif
  TcpStoreOptions store_options;
  store_options.token = store_token(o, plan, single);
  store_options.connect_timeout = plan.join_timeout;
  server = host_store(plan, single, store_options);
  job.token = store_options.token;
  job.store_addr = single ? "127.0.0.1" : plan.store_host;
  job.store_port = server ? server->port() : plan.store_port;
  if (!server) {
    std::fprintf(stderr, "lockstep run: waiting for the store at %s\n",
                 format_endpoint(job.store_addr, static_cast<std::uint16_t>(job.store_port)).c_str());
    wait_for_listener(job.store_addr, static_cast<std::uint16_t>(job.store_port), deadline, signal_fd);
  }
  return std::make_shared<TcpStore>(job.store_addr, static_cast<std::uint16_t>(job.store_port), store_options);
}

// The store, then attempts until one succeeds or restarts run out.
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

  // The run id: chosen by the first launcher at the store (node 0 of a
  // fixed job), read by the others.
  if (plan.elastic) {
    job.run_id = store.compare_set("launcher/run_id", "", o.run_id.empty() ? random_hex(6) : o.run_id);
  } else if (server) {
    job.run_id = o.run_id.empty() ? random_hex(6) : o.run_id;
    store.set("launcher/run_id", job.run_id);
  } else {
    try {
      if (!wait_for_keys(store, {"launcher/run_id"}, rendezvous_deadline, signal_fd, "node 0 to publish the run id"))
        throw ConfigError(fmt::format("node 0's store at {}:{} never published the run id within {:.0f} s; is "
                                      "another program listening on that port?",
                                      job.store_addr, job.store_port,
                                      seconds_between(Clock::now(), rendezvous_deadline.at())));
    } catch (const Interrupted& e) {
      announce_interruption(store, nullptr, who, e);
      throw;
    }
    job.run_id = store.get("launcher/run_id");
  }
  // Unique to this launcher (unlike the run id, which every node shares and
  // a user may choose), so it names exactly this node's segments.
  job.shm_tag = random_hex(6);
  ScratchDirectory scratch;
  job.run_dir = (o.log_dir.empty() ? scratch.create() : std::filesystem::path(o.log_dir)) / job.run_id;

  std::unique_ptr<ElasticRendezvous> elastic;
  if (plan.elastic) {
    ElasticOptions eo;
    eo.min_nodes = plan.nodes.min;
    eo.max_nodes = plan.nodes.max;
    eo.join_timeout = plan.join_timeout;
    eo.last_call = plan.last_call;
    eo.id = job.run_id;
    eo.endpoint = plan.etcd ? store_name : format_endpoint(job.store_addr, static_cast<std::uint16_t>(job.store_port));
    const RendezvousConf conf = parse_rdzv_conf(o.rdzv_conf);  // checked by plan_job
    if (conf.keep_alive_interval > 0)
      eo.keep_alive.interval = Duration(static_cast<std::int64_t>(conf.keep_alive_interval * 1000));
    if (conf.keep_alive_max_attempt > 0) eo.keep_alive.max_attempts = conf.keep_alive_max_attempt;
    elastic = std::make_unique<ElasticRendezvous>(store, eo, nproc, host_name(), signal_fd);
    // etcd keeps a job's keys until its lease runs out, after its last
    // launcher left: a new job under the same id would find it over.
    if (plan.etcd && store.check({"rdzv/finished"}))
      throw ConfigError(fmt::format("rendezvous '{}' in {} belongs to a job that has finished (etcd drops its keys "
                                    "about a minute after its last launcher left); choose another --rdzv-id",
                                    job.run_id, store_name));
  }

  int failures = 0;
  int last_world = -1;
  const std::vector<std::string> command =
      rank_command(o.program, EntryPoint{.module = o.module, .no_python = o.no_python, .run_path = o.run_path});
  for (int attempt = 0;; ++attempt) {
    Round round;
    Endpoint master;
    RoundStore round_store;  // the ranks' store of this round, under etcd
    try {
      if (elastic) {
        auto next = elastic->next_round();
        if (!next) {
          std::fprintf(stderr, "lockstep run: the job finished while this node waited to join it\n");
          return 0;
        }
        round = *next;
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
    SupervisorOptions sup;
    std::vector<RankProcess> ranks;
    ranks.reserve(static_cast<std::size_t>(nproc));
    for (int local = 0; local < nproc; ++local) {
      sup.rank_dirs.push_back(attempt_dir(job, round, local));
      std::filesystem::create_directories(sup.rank_dirs.back());
      std::filesystem::remove(sup.rank_dirs.back() / "error.json");  // an earlier job's, with this run id
      ranks.emplace_back(round.first_rank + local, command, rank_env(o, round, nproc, local, job, master, failures));
    }
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
    const std::string failed_key = fmt::format("launcher/{}/failed", round.number);
    bool regroup = false;     // a node waits to join: stop, and re-form the group
    bool store_lost = false;  // the store's host is gone: nothing to re-form with
    bool round_over = false;  // a node stopped beating, or the rendezvous moved on: re-form
    // The store did not answer in time while this launcher ran: this node
    // may be cut off from it for a while, not for good.
    bool store_unanswered = false;
    const auto store_gone = [&](const Error& e) {
      if (plan.etcd)
        return fmt::format("{} refused this launcher's request ({}), and the job cannot go on without it{}", store_name,
                           e.what(), elastic->pause_note());
      return fmt::format("the store at {}:{} is gone ({}); the node that hosted it has left, and the job cannot go on "
                         "without it{}",
                         job.store_addr, job.store_port, e.what(), elastic ? elastic->pause_note() : "");
    };
    if (!single) {
      sup.remote_failure = [&]() -> std::optional<std::string> {
        if (elastic) elastic->note_poll(round);
        try {
          if (store.check({failed_key})) return "another node reported: " + store.get(failed_key);
          if (elastic && round.nnodes < plan.nodes.max && elastic->nodes_waiting(round) > 0) {
            regroup = true;
            // Before any rank stops: the ranks that see a peer go read it
            // and report the planned stop, not a failure.
            const std::string why = "a node joins the job; re-forming the group";
            store.compare_set(launcher_stop_key(round.number), "", why);
            if (plan.etcd) tell_round_ranks(round_store, launcher_stop_key(round.number), why);
            return "a new node is waiting to join; re-forming the group";
          }
          if (elastic) {
            if (auto over = elastic->watch(round)) {
              round_over = true;
              return over;
            }
          }
        } catch (const TimeoutError& e) {
          // Unless this launcher was stopped between its polls (then the
          // others went on without it for good).
          if (elastic && !elastic->paused_before_poll()) {
            store_unanswered = true;
            return fmt::format("{} (or this node is cut off from it)", e.what());
          }
          store_lost = true;
          return store_gone(e);
        } catch (const Error& e) {
          store_lost = true;
          return store_gone(e);
        }
        return std::nullopt;
      };
    }
    sup.unprefixed_rank0 = o.unprefixed_rank0;
    const AttemptResult result = supervise(ranks, signal_fd, sup);
    remove_leftover_segments(job.shm_tag);
    merge_rank_traces(round, nproc);

    if (result.ok) {
      if (!single) {
        // "done" last: once every node has said it, the store's host leaves.
        if (elastic) elastic->mark_finished();
        if (elastic) elastic->mark_done(round);
        store.add(fmt::format("launcher/{}/done", round.number), 1);
        // Under etcd, node 0 of the round hosts its ranks' store instead.
        if ((server || round_store.server) && elastic)
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
    if (store_unanswered) {
      // Not a failure of the ranks: no restart is counted (as a node joining).
      std::fprintf(stderr, "lockstep run: stopped this node's %zu rank(s): %s\n", ranks.size(),
                   result.first_failure->reported_by.c_str());
      if (!reach_store_again(store, job, plan.join_timeout, signal_fd)) return 1;
      continue;  // joins the next round, or learns that the job is over
    }
    // A node waiting to join stops this attempt too when a peer's ranks,
    // stopped for it a moment earlier, made ours fail first.
    if (elastic && !regroup && !store_lost && round.nnodes < plan.nodes.max) {
      try {
        regroup = elastic->nodes_waiting(round) > 0;
      } catch (const Error&) {
        // The store is gone: handled as a failure below.
      }
    }
    // So does a node that stopped beating: our ranks may fail first (they
    // were in a collective with ranks another launcher stopped for it).
    if (elastic && !regroup && !store_lost && !round_over) {
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
    if (round_over && !regroup && !store_lost) {
      // Not a failure of the ranks: no restart is counted (as a node joining).
      std::fprintf(stderr, "lockstep run: stopped this node's %zu rank(s): %s\n", ranks.size(),
                   result.first_failure->reported_by.c_str());
      continue;  // joins the next round, or learns that the job is over
    }
    if (regroup) {
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
        store_unanswered = true;  // cut off from it, perhaps for a while: reached again below
        std::fprintf(stderr, "lockstep run: %s did not answer in time (%s)\n", store_name.c_str(), e.what());
      } catch (const Error& e) {
        if (!elastic) throw;
        store_lost = true;  // its host died with the others' ranks; say why this node stops
        std::fprintf(stderr, "lockstep run: %s is gone (%s); the job cannot go on without it\n", store_name.c_str(),
                     e.what());
      }
    }
    print_failure(f, round.node_rank, attempt, ranks.size() - (f.reported_by.empty() ? 1 : 0));
    if (failed_here && !store_lost) print_other_nodes_failures(store, round, std::chrono::seconds(1));
    if (failures >= o.max_restarts || store_lost) {
      // The failed rank's own code; a failure on another node has none here.
      return f.reported_by.empty() ? f.status.as_exit_code() : 1;
    }
    ++failures;
    if (store_unanswered) {
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

}  // namespace

}  // namespace lockstep::cli
