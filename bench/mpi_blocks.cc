// mpi_blocks: the plain-MPI peer of `lockstep bench --op all_to_all`,
// `--op gather` and `--op scatter`: MPI_Alltoall, MPI_Gather and
// MPI_Scatter over the same sizes, with the same options (--op -b -e -f -n
// -w -c -d -r) and the same table (size, count, type, redop, root, time,
// algbw, busbw, #wrong), so the outputs compare line by line. Nothing of
// lockstep is used.
//
//   mpirun -np 2 --bind-to core build/bench/mpi_blocks --op all_to_all -b 4 -e 64M -f 4
//
// As lockstep bench: size is the whole buffer (n blocks); per size, one
// checked run on known inputs (with -c 1), -w untimed iterations, a barrier,
// -n timed iterations; the slowest rank's average per iteration;
// algbw = size / time, busbw = algbw x (n-1)/n (nccl-tests' factor for all
// three).
//
// Single-threaded (MPI_THREAD_SINGLE is all it asks for).
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mpi_elements.h"

namespace {

using namespace mpi_bench;

struct Options : mpi_bench::SweepOptions {
  std::string op = "all_to_all";
  int root = 0;
};



struct Bench {
  const Options& o;
  const ElementType& t;
  int rank, n;
  std::vector<unsigned char> in, out;
  int count = 0;  // per block

  void once() {
    if (o.op == "all_to_all")
      MPI_Alltoall(in.data(), count, t.type, out.data(), count, t.type, MPI_COMM_WORLD);
    else if (o.op == "gather")
      MPI_Gather(in.data(), count, t.type, out.data(), count, t.type, o.root, MPI_COMM_WORLD);
    else
      MPI_Scatter(in.data(), count, t.type, out.data(), count, t.type, o.root, MPI_COMM_WORLD);
  }

  // Elements wrong on this rank after one run on known inputs.
  long long check() {
    const auto un = static_cast<std::size_t>(n), c = static_cast<std::size_t>(count);
    long long wrong = 0;
    if (o.op == "all_to_all") {
      fill(t, in.data(), c * un, rank);
      once();
      for (std::size_t q = 0; q < un; ++q)
        for (std::size_t i = 0; i < c; ++i)
          wrong += value_at(t, out.data(), q * c + i) != input(t, static_cast<int>(q), static_cast<std::size_t>(rank) * c + i);
    } else if (o.op == "gather") {
      fill(t, in.data(), c, rank);
      once();
      if (rank == o.root)
        for (std::size_t q = 0; q < un; ++q)
          for (std::size_t i = 0; i < c; ++i) wrong += value_at(t, out.data(), q * c + i) != input(t, static_cast<int>(q), i);
    } else {
      fill(t, in.data(), c * un, rank);
      once();
      for (std::size_t i = 0; i < c; ++i)
        wrong += value_at(t, out.data(), i) != input(t, o.root, static_cast<std::size_t>(rank) * c + i);
    }
    return wrong;
  }
};

int run(const Options& o, int rank, int n) {
  const auto* type = std::find_if(std::begin(kTypes), std::end(kTypes), [&](const auto& t) { return o.dtype == t.name; });
  const std::size_t min_bytes = parse_size(o.min_bytes), max_bytes = parse_size(o.max_bytes);
  std::string problem;
  if (o.op != "all_to_all" && o.op != "gather" && o.op != "scatter") problem = "--op: all_to_all, gather or scatter";
  else if (type == std::end(kTypes)) problem = "-d " + o.dtype + ": use float, double, int32, int64 or uint8";
  else if (min_bytes == 0 || max_bytes == 0) problem = "-b/-e: sizes are bytes with an optional K, M or G";
  else if (o.factor <= 1 && min_bytes != max_bytes) problem = "-f must be greater than 1";
  else if (o.root < 0 || o.root >= n) problem = "-r: not a rank";
  if (!problem.empty()) {
    if (rank == 0) std::fprintf(stderr, "mpi_blocks: %s\n", problem.c_str());
    return 2;
  }
  const bool rooted = o.op != "all_to_all";
  if (rank == 0) {
    std::printf("# mpi_blocks: %d ranks, MPI %s, %d iterations after %d warm-up, check %s\n", n, o.op.c_str(), o.iters,
                o.warmup, o.check ? "on" : "off");
    std::printf("#\n# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "root", "time",
                "algbw", "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %6s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
                "(GB/s)", "");
  }
  long long wrong_total = 0;
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t bytes = min_bytes;; bytes = static_cast<std::size_t>(static_cast<double>(bytes) * o.factor)) {
    Bench b{o, *type, rank, n, {}, {}, 0};
    const std::size_t block = std::max<std::size_t>(1, bytes / type->size / un);
    b.count = static_cast<int>(block);
    const std::size_t whole = block * un * type->size;
    b.in.assign(o.op == "gather" ? block * type->size : whole, 0);
    b.out.assign(o.op == "scatter" ? block * type->size : whole, 0);
    long long wrong = o.check ? b.check() : 0;
    for (int i = 0; i < o.warmup; ++i) b.once();
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < o.iters; ++i) b.once();
    double us = (MPI_Wtime() - start) * 1e6 / std::max(1, o.iters);
    MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    wrong_total += wrong;
    const double algbw = static_cast<double>(whole) / (us * 1e3);
    const double busbw = algbw * (n - 1) / n;
    if (rank == 0) {
      std::printf("  %10zu %12zu %8s %6s %6d %10.2f %8.2f %8.2f %7s\n", whole, block, type->name, "none",
                  rooted ? o.root : -1, us, algbw, busbw, o.check ? std::to_string(wrong).c_str() : "N/A");
      std::fflush(stdout);
    }
    if (bytes >= max_bytes || o.factor <= 1) break;
  }
  if (rank == 0) std::printf("# Out of bounds values : %lld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"MPI_Alltoall / MPI_Gather / MPI_Scatter benchmark with lockstep bench's options and table"};
  app.add_option("--op", o.op, "all_to_all, gather or scatter")->capture_default_str();
  mpi_bench::add_sweep_options(app, o);
  app.add_option("-r,--root", o.root, "Root rank for gather and scatter")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int status = run(o, rank, n);
  MPI_Finalize();
  return status;
}
