// `lockstep run`: its options (torchrun's, with lockstep's additions) and
// run_job, which resolves them (job_plan.h) and hands the job to this
// node's launcher (attempt_loop.h, where one attempt is laid out step by
// step). See run_command.h and docs/launcher.md.
#include "run/run_command.h"

#include <signal.h>
#include <sys/signalfd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <lockstep_option_checks/option_checks.h>

#include "common/env.h"
#include "common/unique_fd.h"
#include "lockstep/affinity.h"
#include "lockstep/error.h"
#include "run/attempt_loop.h"
#include "run/interruption.h"
#include "run/job_plan.h"
#include "run/run_arguments.h"
#include "run/slurm_defaults.h"

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
  run->add_option("--on-rank-failure", o.on_rank_failure, "When a rank dies: restart (stop the others; with --max-restarts start all again) or continue (the others go on without it, re-forming their group in place: docs/faults.md)")->capture_default_str()->check(CLI::IsMember({"restart", "continue"}));
  run->add_option("--max-replacements", o.max_replacements, "With --on-rank-failure continue: start a new process for a rank of this node that died, up to this many times; it joins the running group at a step boundary and gets its state from its peers (docs/faults.md)")->capture_default_str()->check(option_checks::non_negative_count());
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

}  // namespace lockstep::cli
