// `lockstep run`: the launcher, a torchrun equivalent. Registers its options
// on a CLI11 subcommand and runs the job when selected.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/clock.h"

namespace lockstep::cli {

struct RunOptions {
  std::string nproc_per_node = "1";  // a number or "auto"
  std::string nnodes = "1";          // "N", or "MIN:MAX" for an elastic job
  int node_rank = -1;                // -1: not given (0 for a fixed --nnodes)
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (single node only)
  std::string rdzv_endpoint;  // "host[:port]": the store (replaces --master-addr/--master-port)
  std::string rdzv_backend;   // "static" (fixed --node-rank) or "c10d" (nodes ranked by the rendezvous)
  std::string rdzv_conf;      // "join_timeout=S,last_call_timeout=S"
  bool standalone = false;
  int max_restarts = 0;
  // What the death of a rank does to the others: "restart" stops them (and
  // restarts all with --max-restarts), "continue" lets them go on without it
  // (docs/faults.md: they re-form their group in place).
  std::string on_rank_failure = "restart";
  // With "continue": start a new process for a rank of this node that died,
  // up to this many times in a round; it joins the running group.
  int max_replacements = 0;
  std::string log_dir;
  std::string tee;        // "0".."3", or "local_rank:n,..." as torchrun's --tee
  std::string redirects;  // the same, as torchrun's --redirects
  double monitor_interval = 0.2;
  bool no_prefix = false;
  bool unprefixed_rank0 = false;
  double grace_seconds = 5;
  double rendezvous_seconds = 300;
  double last_call_seconds = 3;
  std::string backend;
  std::string run_id;  // --rdzv-id / --run-id
  std::string role = "default";
  bool module = false;      // -m: run the program as a Python module
  bool no_python = false;   // --no-python: run it as it is, even a .py file
  bool run_path = false;    // --run-path: run a Python file through runpy.run_path
  std::string start_method = "spawn";  // accepted for torchrun's sake: ranks are always fresh processes
  std::string local_ranks_filter;        // console output from these local ranks only ("0,1"; empty: all)
  std::string duplicate_stdout_filters;  // lines with any of these ("a,b") also to attempt_k/filtered_stdout.log
  std::string duplicate_stderr_filters;
  std::string local_addr;  // this node's address for MASTER_ADDR when it is node 0 (default: the one that reaches the store)
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // torchrun options lockstep refuses, with the reason (job_plan.cc).
  bool virtual_local_rank = false;
  std::string numa_binding;
  std::string logs_specs;
  std::string event_log_handler;
  std::vector<std::string> program;  // the program and its arguments
};

// Returns the subcommand, which separate_program() needs.
CLI::App* add_run_command(CLI::App& app, RunOptions& options);

// Runs the job; returns the launcher's exit code.
int run_job(const RunOptions& options);

}  // namespace lockstep::cli
