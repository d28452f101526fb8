// `lockstep doctor [options] [-- PROGRAM ARGS...]`: runs a data-parallel
// program (by default a built-in MLP) at several world sizes on this host,
// collects the step statistics every DistributedDataParallel writes
// (LOCKSTEP_STATS), and writes a diagnosis with the numbers behind it and a
// plot of step time and efficiency against world size.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lockstep::cli {

struct DoctorOptions {
  int max_ranks = 0;          // 0: the number of cores
  std::string ranks;          // explicit list, e.g. "1,2,4"
  bool strong = false;        // fixed global batch (built-in workload only)
  std::string out = "lockstep-doctor";
  // Built-in workload.
  int layers = 6;
  int width = 2048;
  int batch = 64;
  int steps = 20;
  double bucket_cap_mb = 25;
  std::vector<std::string> program;
};

void add_doctor_command(CLI::App& app, DoctorOptions& options);
int run_doctor(const DoctorOptions& options);

}  // namespace lockstep::cli
