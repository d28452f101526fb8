// `lockstep bench`: a collective benchmark with nccl-tests' interface and
// output (size, count, type, redop, root, time, algbw, busbw, #wrong).
// Launches its own local ranks with -np, or runs as one rank under
// `lockstep run`, torchrun or mpirun.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lockstep::cli {

struct BenchOptions {
  std::string op = "allreduce";  // allreduce|broadcast|allgather|reduce_scatter|reduce|all
  std::string backend;  // empty: LOCKSTEP_BACKEND, else auto
  int nranks = 0;  // -np: launch this many local ranks; 0 (not given): run as one rank of a launched job
  std::string min_bytes = "32M";
  std::string max_bytes = "32M";
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string dtype = "float";
  std::string redop = "sum";
  int root = 0;
  std::string json_path;
  bool pin = true;
  bool shared_buffers = false;  // place buffers in the backend's shared memory when it has some
  bool out_of_place = false;    // allreduce from one buffer into another (nccl-tests' out-of-place column)
  std::string device = "host";  // host or cuda
  int busy = 0;  // with nranks: processes spinning beside the ranks (busy_load.h)
};

void add_bench_command(CLI::App& app, BenchOptions& options);

// `argv` is the CLI's own command line, used to start the ranks with -np.
int run_bench(const BenchOptions& options, const std::vector<std::string>& argv);

}  // namespace lockstep::cli
