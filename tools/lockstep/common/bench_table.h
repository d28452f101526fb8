// Reads what `lockstep bench` writes: its nccl-tests style table (stdout)
// or its --json file, into rows of (ranks, backend, op, size, time, and
// from the JSON the CPU it took and the machine's copy rate and cores).
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
  // --json only (0 where unknown): the CPU time a rank's process used per
  // iteration, and, for the whole run, one rank's memory copy rate and the
  // cores each rank of a host could use.
  double cpu_us = 0;
  double memcpy_gb_per_s = 0;
  double cores_per_rank = 0;
  // The element type (float, half, bfloat16, ...; the table's type column),
  // the ranks of one host (--json only; 0 where unknown), whether the
  // buffers were the group's shared ones (--shared-buffers; from the
  // table's header too), and, for 16-bit types (--json), the compression
  // hooks' conversion rates in GB/s of fp32.
  std::string dtype = "float";
  int ranks_per_host = 0;
  bool shared_buffers = false;
  // allreduce from one buffer into another (--out-of-place), not in place.
  bool out_of_place = false;
  // Processes that spun beside the ranks while this row was measured
  // (bench --busy N; the table's header too): 0 for an idle machine.
  int busy = 0;
  double narrow_gb_per_s = 0;
  double widen_gb_per_s = 0;
};

// Either format; the table's header ("# lockstep bench: N ranks, backend
// B") gives ranks and backend, a "# <op>" line the op (allreduce when none).
// Throws ConfigError when nothing in it is a result row.
std::vector<BenchRow> parse_bench_output(const std::string& text);
std::vector<BenchRow> read_bench_file(const std::string& path);

}  // namespace lockstep::cli
