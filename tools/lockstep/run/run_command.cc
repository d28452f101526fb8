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

#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "common/env.h"
#include "common/env_vars.h"
#include "common/host.h"
#include "common/socket.h"
#include "diag/tracer.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "comm/shm/region.h"
#include "run/interruption.h"
#include "run/supervisor.h"

namespace lockstep::cli {
namespace {

int resolve_nproc(const std::string& text) {
  if (text == "auto") {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  // Bounded before the narrowing to int, so 4294967297 is not taken as 1.
  constexpr std::int64_t kMaxPerNode = 1 << 16;
  const auto n = parse_int(text);
  if (!n || *n < 1 || *n > kMaxPerNode)
    throw ConfigError(fmt::format("--nproc-per-node '{}' is not a positive number up to {} or 'auto'", text,
                                  kMaxPerNode));
  return static_cast<int>(*n);
}

// The signals the launcher handles, delivered through a signalfd.
UniqueFd block_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  return UniqueFd(::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC));
}

struct Layout {
  int world_size = 0;
  int first_rank = 0;  // this node's first global rank
};

// Agrees with the other launchers on the world of this attempt.
Layout rendezvous_nodes(Store& store, const RunOptions& o, int nproc, int attempt, int signal_fd) {
  if (o.nnodes == 1) return {nproc, 0};
  store.set(fmt::format("launcher/{}/nproc/{}", attempt, o.node_rank), std::to_string(nproc));
  std::vector<std::string> keys;
  for (int n = 0; n < o.nnodes; ++n) keys.push_back(fmt::format("launcher/{}/nproc/{}", attempt, n));
  const Deadline deadline = Deadline::after(Duration(static_cast<std::int64_t>(o.rendezvous_seconds * 1000)));
  if (!wait_for_keys(store, keys, deadline, signal_fd, fmt::format("the other {} node(s) to join", o.nnodes - 1))) {
    std::string missing;
    for (int n = 0; n < o.nnodes; ++n)
      if (!store.check({keys[static_cast<std::size_t>(n)]})) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", n);
    throw ConfigError(fmt::format("node(s) {} of {} did not join within {:.0f} s; start `lockstep run` with the same "
                                  "--nnodes, --master-addr and --master-port on every node",
                                  missing, o.nnodes, o.rendezvous_seconds));
  }
  Layout layout;
  for (int n = 0; n < o.nnodes; ++n) {
    const int count = static_cast<int>(parse_int(store.get(keys[static_cast<std::size_t>(n)])).value_or(0));
    if (n < o.node_rank) layout.first_rank += count;
    layout.world_size += count;
  }
  return layout;
}

std::map<std::string, std::string> rank_env(const RunOptions& o, const Layout& layout, int nproc, int local_rank,
                                            int port, const std::string& run_id, const std::string& token,
                                            const std::string& shm_tag, int attempt) {
  std::map<std::string, std::string> env{
      {env::kRank, std::to_string(layout.first_rank + local_rank)},
      {env::kLocalRank, std::to_string(local_rank)},
      {env::kWorldSize, std::to_string(layout.world_size)},
      {env::kLocalWorldSize, std::to_string(nproc)},
      {env::kGroupRank, std::to_string(o.node_rank)},
      {env::kMasterAddr, o.master_addr},
      {env::kMasterPort, std::to_string(port)},
      {env::kStoreHosted, "1"},
      {env::kRunId, run_id},
      {env::kRestartCount, std::to_string(attempt)},
      {env::kShmTag, shm_tag},
      {env::kTorchelasticRestartCount, std::to_string(attempt)},
  };
  if (!token.empty()) env[env::kStoreToken] = token;
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
  return fmt::format("rank {} on node {} failed: {}", f.rank, node_rank, f.status.describe());
}

// Node 0 hosts the store: it waits for every node to finish before exiting.
void wait_for_nodes(Store& store, const RunOptions& o, int attempt, int signal_fd) {
  const std::string done = fmt::format("launcher/{}/done", attempt);
  const std::string failed = fmt::format("launcher/{}/failed", attempt);
  while (store.add(done, 0) < o.nnodes && !store.check({failed})) {
    throw_if_interrupted(signal_fd, "the other nodes to finish");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Removes what this node's ranks left in /dev/shm; they have all exited.
void remove_leftover_segments(const std::string& shm_tag) {
  const std::size_t removed = shm::remove_tagged_segments(shm_tag);
  if (removed > 0)
    std::fprintf(stderr, "lockstep run: removed %zu shared-memory segment(s) left in /dev/shm by this node's ranks\n",
                 removed);
}

// With LOCKSTEP_TRACE set, each rank wrote <prefix>.rank<r>.json: merge this
// node's into one file (<prefix>.json on node 0, <prefix>.node<k>.json on
// others), one track group per rank.
void merge_rank_traces(const RunOptions& o, const Layout& layout, int nproc) {
  const auto prefix = env_string(env::kTrace);
  if (!prefix) return;
  std::vector<std::string> files;
  for (int local = 0; local < nproc; ++local) files.push_back(fmt::format("{}.rank{}.json", *prefix, layout.first_rank + local));
  const std::string out = o.node_rank == 0 ? *prefix + ".json" : fmt::format("{}.node{}.json", *prefix, o.node_rank);
  const std::size_t merged = diag::merge_traces(files, out);
  if (merged > 0) std::fprintf(stderr, "lockstep run: timeline of %zu rank(s) in %s (open it in Perfetto or chrome://tracing)\n", merged, out.c_str());
}

}  // namespace

void add_run_command(CLI::App& app, RunOptions& o) {
  auto* run = app.add_subcommand("run", "Start a program on several processes (and nodes), as torchrun does");
  run->add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node, "Processes on this node: a number or 'auto' (one per core)")->capture_default_str();
  run->add_option("--nnodes", o.nnodes, "Number of nodes")->capture_default_str()->check(CLI::PositiveNumber);
  run->add_option("--node-rank,--node_rank", o.node_rank, "This node's index, 0..nnodes-1")->capture_default_str()->check(CLI::NonNegativeNumber);
  run->add_option("--master-addr,--master_addr", o.master_addr, "Address of node 0, which hosts the store")->capture_default_str();
  run->add_option("--master-port,--master_port", o.master_port, "Store port on node 0 (0: pick a free one; single node only)")->capture_default_str()->check(CLI::Range(0, 65535));
  run->add_flag("--standalone", o.standalone, "Single node on this host with a free port (the default for one node)");
  run->add_option("--max-restarts,--max_restarts", o.max_restarts, "Restart all ranks up to this many times after a failure")->capture_default_str()->check(CLI::NonNegativeNumber);
  run->add_option("--log-dir,--log_dir", o.log_dir, "Also write each rank's output to DIR/rank<r>.log");
  run->add_flag("--no-prefix", o.no_prefix, "Do not prefix output lines with [rank]");
  run->add_flag("--unprefixed-rank0", o.unprefixed_rank0, "Show rank 0's output without a prefix");
  run->add_option("--grace-period", o.grace_seconds, "Seconds between SIGTERM and SIGKILL when stopping ranks")->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  run->add_option("--rdzv-timeout", o.rendezvous_seconds, "Seconds to wait for the other nodes' launchers")->capture_default_str()->check(CLI::Range(0.001, 604800.0));
  run->add_option("--backend", o.backend, "Sets LOCKSTEP_BACKEND for the ranks: auto, tcp, shm, mpi");
  run->add_option("--run-id", o.run_id, "Job identifier (default: random)");
  run->add_option("program", o.program, "The program and its arguments")->required()->expected(-1);
  run->footer(
      "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT, as under\n"
      "torchrun. When a rank fails, the others are stopped and the launcher exits with the failed rank's code.");
}

namespace {

int run_nodes(const RunOptions& o, int nproc, int signal_fd);

}  // namespace

int run_job(const RunOptions& o) {
  if (o.node_rank >= o.nnodes)
    throw ConfigError(fmt::format("--node-rank {} is not below --nnodes {}", o.node_rank, o.nnodes));
  if (o.standalone && o.nnodes > 1) throw ConfigError("--standalone is for a single node; drop it or --nnodes");
  if (o.nnodes > 1 && o.master_port == 0)
    throw ConfigError("several nodes need a fixed --master-port (the same on every node)");
  if (!o.log_dir.empty()) std::filesystem::create_directories(o.log_dir);
  const int nproc = resolve_nproc(o.nproc_per_node);
  UniqueFd signals = block_signals();
  try {
    return run_nodes(o, nproc, signals.fd());
  } catch (const Interrupted& e) {
    std::fprintf(stderr, "lockstep run: %s\n", e.what());
    return 128 + e.signal();
  }
}

namespace {

// The store, then attempts until one succeeds or restarts run out.
int run_nodes(const RunOptions& o, int nproc, int signal_fd) {

  // Node 0 hosts the store. A single node binds loopback only and guards
  // the store with a random token; several nodes share LOCKSTEP_STORE_TOKEN
  // if it is set.
  const bool single = o.nnodes == 1;
  std::string token = env_string(env::kStoreToken).value_or(single ? random_hex(16) : "");
  TcpStoreOptions store_options;
  store_options.token = token;
  store_options.connect_timeout = Duration(static_cast<std::int64_t>(o.rendezvous_seconds * 1000));
  std::unique_ptr<TcpStoreServer> server;
  int port = o.master_port;
  if (o.node_rank == 0) {
    // Several nodes with a loopback --master-addr are all on this host (tests).
    const std::string listen_host =
        single ? "127.0.0.1" : (is_loopback_host(o.master_addr) ? o.master_addr : std::string());
    server = std::make_unique<TcpStoreServer>(listen_host, static_cast<std::uint16_t>(port), store_options);
    port = server->port();
  }
  RunOptions effective = o;
  if (single) effective.master_addr = "127.0.0.1";
  const Deadline rendezvous_deadline = Deadline::after(store_options.connect_timeout);
  if (o.node_rank != 0)
    wait_for_listener(effective.master_addr, static_cast<std::uint16_t>(port), rendezvous_deadline, signal_fd);
  TcpStore store(effective.master_addr, static_cast<std::uint16_t>(port), store_options);
  std::string run_id = o.run_id;
  if (o.node_rank == 0) {
    if (run_id.empty()) run_id = random_hex(6);
    store.set("launcher/run_id", run_id);
  } else {
    if (!wait_for_keys(store, {"launcher/run_id"}, rendezvous_deadline, signal_fd, "node 0 to publish the run id"))
      throw ConfigError(fmt::format("node 0's store at {}:{} never published the run id within {:.0f} s; is another "
                                    "program listening on that port?",
                                    effective.master_addr, port, o.rendezvous_seconds));
    run_id = store.get("launcher/run_id");
  }
  // Unique to this launcher (unlike the run id, which every node shares and
  // a user may choose), so it names exactly this node's segments.
  const std::string shm_tag = random_hex(6);

  for (int attempt = 0;; ++attempt) {
    const Layout layout = rendezvous_nodes(store, effective, nproc, attempt, signal_fd);
    if (attempt == 0)
      std::fprintf(stderr, "lockstep run: %d rank(s) on node %d of %d (world size %d), store %s:%d, run %s\n", nproc,
                   o.node_rank, o.nnodes, layout.world_size, effective.master_addr.c_str(), port, run_id.c_str());
    std::vector<RankProcess> ranks;
    ranks.reserve(static_cast<std::size_t>(nproc));
    for (int local = 0; local < nproc; ++local)
      ranks.emplace_back(layout.first_rank + local, o.program,
                         rank_env(effective, layout, nproc, local, port, run_id, token, shm_tag, attempt));

    SupervisorOptions sup;
    sup.prefix_output = !o.no_prefix;
    sup.log_dir = o.log_dir;
    sup.attempt = attempt;
    sup.grace = Duration(static_cast<std::int64_t>(o.grace_seconds * 1000));
    const std::string failed_key = fmt::format("launcher/{}/failed", attempt);
    if (!single) {
      sup.remote_failure = [&]() -> std::optional<std::string> {
        if (!store.check({failed_key})) return std::nullopt;
        return "another node reported: " + store.get(failed_key);
      };
    }
    sup.unprefixed_rank0 = o.unprefixed_rank0;
    const AttemptResult result = supervise(ranks, signal_fd, sup);
    remove_leftover_segments(shm_tag);
    merge_rank_traces(o, layout, nproc);

    if (result.ok) {
      if (!single) {
        store.add(fmt::format("launcher/{}/done", attempt), 1);
        if (o.node_rank == 0) wait_for_nodes(store, effective, attempt, signal_fd);
      }
      return 0;
    }
    if (result.interrupted_by != 0) {
      if (!single) store.compare_set(failed_key, "", fmt::format("node {} was interrupted", o.node_rank));
      return 128 + result.interrupted_by;
    }
    const RankFailure& f = *result.first_failure;
    if (!single && f.reported_by.empty()) store.compare_set(failed_key, "", failure_line(f, o.node_rank));
    print_failure(f, o.node_rank, attempt, ranks.size() - (f.reported_by.empty() ? 1 : 0));
    if (attempt >= o.max_restarts) {
      // The failed rank's own code; a failure on another node has none here.
      return f.reported_by.empty() ? f.status.as_exit_code() : 1;
    }
    std::fprintf(stderr, "lockstep run: restarting all ranks (restart %d of %d)\n", attempt + 1, o.max_restarts);
  }
}

}  // namespace

}  // namespace lockstep::cli
