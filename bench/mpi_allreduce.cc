// mpi_allreduce: the plain-MPI peer of `lockstep bench --op allreduce`.
// MPI_Allreduce in place (MPI_IN_PLACE) on one buffer per rank, over the
// same sizes, with the same options (-b -e -f -n -w -c -d -o) and the same
// table (size, count, type, redop, root, time, algbw, busbw, #wrong), so
// the two outputs compare line by line. Nothing of lockstep is used.
//
//   mpirun -np 2 --bind-to core build/bench/mpi_allreduce -b 4 -e 64M -f 4
//
// Per size, exactly as lockstep bench does it: (with -c 1) one checked run on
// known inputs, counting wrong elements on every rank; then the inputs are
// refilled, -w untimed warm-up iterations run, all ranks meet in a barrier,
// and -n timed iterations follow. The time reported is the slowest rank's
// average per iteration; algbw = size / time, busbw = algbw x 2(n-1)/n.
// Each rank prints the CPUs it may run on, so a missing --bind-to core (ranks
// sharing cores) shows in the output.
//
// Single-threaded (MPI_THREAD_SINGLE is all it asks for).
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mpi_elements.h"

namespace {

using namespace mpi_bench;

struct Options : mpi_bench::SweepOptions {
  std::string redop = "sum";
};

struct Reduction {
  const char* name;
  MPI_Op op;
};

const Reduction kOps[] = {{"sum", MPI_SUM}, {"min", MPI_MIN}, {"max", MPI_MAX}, {"prod", MPI_PROD}};


double expected(const ElementType& t, const Reduction& r, int n, std::size_t i) {
  double acc = input(t, 0, i);
  for (int q = 1; q < n; ++q) {
    const double v = input(t, q, i);
    if (r.op == MPI_SUM) acc += v;
    else if (r.op == MPI_PROD) acc *= v;
    else if (r.op == MPI_MIN) acc = std::min(acc, v);
    else acc = std::max(acc, v);
  }
  if (t.type == MPI_UINT8_T) acc = static_cast<double>(static_cast<std::uint8_t>(static_cast<std::int64_t>(acc)));
  return acc;
}

// Products of many ranks overflow small types; check prod only where exact.
bool checkable(const ElementType& t, const Reduction& r, int n) {
  return r.op != MPI_PROD || n <= 4 || t.type == MPI_DOUBLE || t.type == MPI_INT64_T;
}

Row measure(const Options& o, const ElementType& t, const Reduction& r, std::size_t bytes, int rank, int n) {
  return measure_in_place(
      o, t, bytes, rank, checkable(t, r, n),
      [&](void* buf, std::size_t count) {
        MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), t.type, r.op, MPI_COMM_WORLD);
      },
      [] { MPI_Barrier(MPI_COMM_WORLD); }, [&](std::size_t i) { return expected(t, r, n, i); });
}

int run(const Options& o, int rank, int n) {
  const auto* type = std::find_if(std::begin(kTypes), std::end(kTypes), [&](const auto& t) { return o.dtype == t.name; });
  const auto* op = std::find_if(std::begin(kOps), std::end(kOps), [&](const auto& r) { return o.redop == r.name; });
  const std::size_t min_bytes = parse_size(o.min_bytes), max_bytes = parse_size(o.max_bytes);
  std::string problem;
  if (type == std::end(kTypes)) problem = "-d " + o.dtype + ": use float, double, int32, int64 or uint8";
  else if (op == std::end(kOps)) problem = "-o " + o.redop + ": use sum, min, max or prod";
  else if (max_bytes / type->size > static_cast<std::size_t>(INT32_MAX)) problem = "-e: more elements than MPI's int count";
  else problem = sweep_problem(o, min_bytes, max_bytes);
  if (!problem.empty()) {
    if (rank == 0) std::fprintf(stderr, "mpi_allreduce: %s\n", problem.c_str());
    return 2;
  }

  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(version, &length);
  const std::string library(version, std::strcspn(version, ",\n"));
  const std::string cpus = cpus_of_every_rank(rank, n);
  if (rank == 0) {
    std::printf("# mpi_allreduce: %d ranks, %s, MPI_Allreduce in place, %d iterations after %d warm-up, check %s\n", n,
                library.c_str(), o.iters, o.warmup, o.check ? "on" : "off");
    std::printf("# cpus:%s\n", cpus.c_str());
    print_table_head();
  }
  return sweep_allreduce(o, min_bytes, max_bytes, type->name, op->name, rank, n,
                         [&](std::size_t bytes) { return measure(o, *type, *op, bytes, rank, n); });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"MPI_Allreduce benchmark with lockstep bench's options and table"};
  mpi_bench::add_sweep_options(app, o);
  app.add_option("-o,--op_type", o.redop, "sum, min, max, prod")->capture_default_str();
  // Parse before MPI_Init so --help works without mpirun; every rank sees
  // the same command line, so every rank reaches the same verdict.
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
