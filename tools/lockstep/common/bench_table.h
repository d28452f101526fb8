// Reads what `lockstep bench` writes: its nccl-tests style table (stdout)
// or its --json file, into rows of (ranks, backend, op, size, time).
// Pure functions over text; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace lockstep::cli {

struct BenchRow {
  int ranks = 0;
  std::string backend;
  std::string op;  // allreduce, broadcast, ...
  double bytes = 0;
  double time_us = 0;
};

// Either format; the table's header ("# lockstep bench: N ranks, backend
// B") gives ranks and backend, a "# <op>" line the op (allreduce when none).
// Throws ConfigError when nothing in it is a result row.
std::vector<BenchRow> parse_bench_output(const std::string& text);
std::vector<BenchRow> read_bench_file(const std::string& path);

}  // namespace lockstep::cli
