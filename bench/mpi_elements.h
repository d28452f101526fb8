// What the MPI-started peers of `lockstep bench` (mpi_allreduce, mpi_blocks,
// ccl_allreduce) share: the size sweep and its command-line options
// (lockstep bench's names), the element types they run, the sizes they
// accept ("64K", "32M"), lockstep bench's known input, written and read back
// in any type, and the all-reduce table that lockstep bench prints.
#pragma once

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <lockstep_option_checks/option_checks.h>

#include <CLI/CLI.hpp>

namespace mpi_bench {

// The sweep every peer runs, with lockstep bench's defaults.
struct SweepOptions {
  std::string min_bytes = "32M";
  std::string max_bytes = "32M";
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  std::string dtype = "float";
};

inline void add_sweep_options(CLI::App& app, SweepOptions& o) {
  app.add_option("-b,--minbytes", o.min_bytes, "Smallest size (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "Largest size")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "Multiply the size by this between rows")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "Timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "Untimed iterations first")->capture_default_str();
  app.add_option("-c,--check", o.check, "Check results (count wrong elements): 0 or 1")->capture_default_str();
  app.add_option("-d,--datatype", o.dtype, "float, double, int32, int64, uint8")->capture_default_str();
}

struct ElementType {
  const char* name;
  MPI_Datatype type;
  std::size_t size;
};

inline const ElementType kTypes[] = {
    {"float", MPI_FLOAT, 4}, {"double", MPI_DOUBLE, 8}, {"int32", MPI_INT32_T, 4},
    {"int64", MPI_INT64_T, 8}, {"uint8", MPI_UINT8_T, 1},
};

// "4", "64K", "32M", "1G" -> bytes (the same reading as `lockstep bench`'s
// -b/-e); 0 if malformed.
inline std::size_t parse_size(const std::string& text) {
  return static_cast<std::size_t>(lockstep::option_checks::byte_size(text).value_or(0));
}

// lockstep bench's known input: small integers, exact in every type.
inline double pattern(int rank, std::size_t i) { return static_cast<double>((rank * 3 + i * 7) % 9) - 4; }
inline double input(const ElementType& t, int rank, std::size_t i) {
  return t.type == MPI_UINT8_T ? pattern(rank, i) + 4 : pattern(rank, i);
}

inline void fill(const ElementType& t, void* buf, std::size_t count, int rank) {
  for (std::size_t i = 0; i < count; ++i) {
    const double v = input(t, rank, i);
    if (t.type == MPI_FLOAT) static_cast<float*>(buf)[i] = static_cast<float>(v);
    else if (t.type == MPI_DOUBLE) static_cast<double*>(buf)[i] = v;
    else if (t.type == MPI_INT32_T) static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v);
    else if (t.type == MPI_INT64_T) static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v);
    else static_cast<std::uint8_t*>(buf)[i] = static_cast<std::uint8_t>(v);
  }
}

inline double value_at(const ElementType& t, const void* buf, std::size_t i) {
  if (t.type == MPI_FLOAT) return static_cast<const float*>(buf)[i];
  if (t.type == MPI_DOUBLE) return static_cast<const double*>(buf)[i];
  if (t.type == MPI_INT32_T) return static_cast<const std::int32_t*>(buf)[i];
  if (t.type == MPI_INT64_T) return static_cast<double>(static_cast<const std::int64_t*>(buf)[i]);
  return static_cast<const std::uint8_t*>(buf)[i];
}

// One size's result, as the table shows it.
struct Row {
  std::size_t bytes = 0;
  std::size_t count = 0;
  double time_us = 0;  // the slowest rank's average per iteration
  long long wrong = 0;
};

// The sweep's own checks of -b, -e and -f: what is wrong, or "" when they hold.
inline std::string sweep_problem(const SweepOptions& o, std::size_t min_bytes, std::size_t max_bytes) {
  if (min_bytes == 0 || max_bytes == 0) return "-b/-e: sizes are bytes with an optional K, M or G";
  if (o.factor <= 1 && min_bytes != max_bytes) return "-f must be greater than 1";
  return "";
}

// Every rank's allowed CPUs, gathered to rank 0 for the header: " rank 0 on
// 0; rank 1 on 1;" there, "" on the other ranks. Collective.
inline std::string cpus_of_every_rank(int rank, int n) {
  char mine[256] = {0};
  cpu_set_t set;
  std::string cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) cpus = "?";
  else
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
  std::snprintf(mine, sizeof mine, "%s", cpus.c_str());
  std::vector<char> all(static_cast<std::size_t>(n) * sizeof mine);
  MPI_Gather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string out;
  if (rank == 0)
    for (int q = 0; q < n; ++q)
      out += " rank " + std::to_string(q) + " on " + std::string(&all[static_cast<std::size_t>(q) * sizeof mine]) + ";";
  return out;
}

// One size of an in-place all-reduce, as lockstep bench measures it: (with
// -c) one run on known inputs, counting the elements that differ from
// expected(i) where `checkable`; then the inputs refilled, -w warm-up runs,
// barrier(), and -n timed runs. allreduce(buf, count) runs the collective
// measured. The slowest rank's average and every rank's wrong count are
// combined over MPI.
template <class Allreduce, class Barrier, class Expected>
Row measure_in_place(const SweepOptions& o, const ElementType& t, std::size_t bytes, int rank, bool checkable,
                     Allreduce allreduce, Barrier barrier, Expected expected) {
  Row row;
  row.count = std::max<std::size_t>(1, bytes / t.size);
  row.bytes = row.count * t.size;
  std::vector<unsigned char> buf(row.bytes);
  if (o.check) {
    fill(t, buf.data(), row.count, rank);
    allreduce(buf.data(), row.count);
    if (checkable)
      for (std::size_t i = 0; i < row.count; ++i) row.wrong += value_at(t, buf.data(), i) != expected(i);
  }
  fill(t, buf.data(), row.count, rank);
  for (int i = 0; i < o.warmup; ++i) allreduce(buf.data(), row.count);
  barrier();
  const double start = MPI_Wtime();
  for (int i = 0; i < o.iters; ++i) allreduce(buf.data(), row.count);
  double us = (MPI_Wtime() - start) * 1e6 / std::max(1, o.iters);
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &row.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  row.time_us = us;
  return row;
}

// The all-reduce table's column heads (after each peer's own first line).
inline void print_table_head() {
  std::printf("#\n# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "root", "time", "algbw",
              "busbw", "#wrong");
  std::printf("# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)",
              "");
}

// The sweep from min_bytes to max_bytes by o.factor: measure(bytes) -> Row
// on every rank, each row and the footer printed by rank 0, as lockstep
// bench prints them (busbw = algbw x 2(n-1)/n). Returns the exit status:
// 1 if any element was wrong.
template <class Measure>
int sweep_allreduce(const SweepOptions& o, std::size_t min_bytes, std::size_t max_bytes, const char* type_name,
                    const char* op_name, int rank, int n, Measure measure) {
  double busbw_sum = 0;
  int rows = 0;
  long long wrong_total = 0;
  for (std::size_t bytes = min_bytes;; bytes = static_cast<std::size_t>(static_cast<double>(bytes) * o.factor)) {
    const Row row = measure(bytes);
    const double algbw = static_cast<double>(row.bytes) / (row.time_us * 1e3);  // GB/s
    const double busbw = algbw * 2.0 * (n - 1) / n;
    busbw_sum += busbw;
    wrong_total += row.wrong;
    ++rows;
    if (rank == 0) {
      std::printf("  %10zu %12zu %8s %6s %6d %10.2f %8.2f %8.2f %7s\n", row.bytes, row.count, type_name, op_name, -1,
                  row.time_us, algbw, busbw, o.check ? std::to_string(row.wrong).c_str() : "N/A");
      std::fflush(stdout);
    }
    if (bytes >= max_bytes || o.factor <= 1) break;
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n", rows ? busbw_sum / rows : 0);
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace mpi_bench
