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
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (single node only)
  bool standalone = false;
  int max_restarts = 0;
  std::string log_dir;
  bool no_prefix = false;
  bool unprefixed_rank0 = false;
  double grace_seconds = 5;
  double rendezvous_seconds = 300;
  std::string backend;
  std::string run_id;
  std::vector<std::string> program;  // the program and its arguments
};

void add_run_command(CLI::App& app, RunOptions& options);

// Runs the job; returns the launcher's exit code.
int run_job(const RunOptions& options);

}  // namespace lockstep::cli
