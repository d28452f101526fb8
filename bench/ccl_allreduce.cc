// ccl_allreduce: the Intel oneCCL peer of `lockstep bench --op allreduce`.
// ccl::allreduce in place (the same buffer as send and receive) on one
// buffer per rank, over the same sizes, with the same options (-b -e -f -n
// -w -c -d -o) and the same table (size, count, type, redop, root, time,
// algbw, busbw, #wrong) as lockstep bench and bench/mpi_allreduce.cc, so the
// outputs compare line by line. Nothing of lockstep is used.
//
// Not part of the CMake build: oneCCL and Intel MPI come from PyPI's wheels
// (scripts/install-oneccl.sh installs them into .venv/oneccl), and
// bench/compare_allreduce.py compiles this file with g++ against them into
// BUILD/bench/ccl_allreduce. By hand:
//
//   V=.venv/oneccl
//   g++ -std=c++20 -O2 -DMPICH_SKIP_MPICXX -Ibench -Itools/option_checks -I$V/include
//       bench/ccl_allreduce.cc -L$V/lib -Wl,-rpath,$PWD/$V/lib -lccl -lmpi -o build/bench/ccl_allreduce
//   I_MPI_ROOT=$V CCL_ATL_TRANSPORT=ofi FI_PROVIDER=shm
//       $V/bin/mpiexec -n 2 build/bench/ccl_allreduce -b 4 -e 64M -f 4
//
// Bootstrap: Intel MPI's mpiexec starts the ranks; rank 0 creates oneCCL's
// main key-value store and MPI_Bcast hands its address to the others (the
// pattern of oneCCL's own samples). MPI also takes the slowest rank's time
// and the wrong-element count; the collective measured is oneCCL's alone
// (which transport it uses, MPI or libfabric, CCL_ATL_TRANSPORT says).
//
// Per size, exactly as lockstep bench does it: (with -c 1) one checked run on
// known inputs, counting wrong elements on every rank; then the inputs are
// refilled, -w untimed warm-up iterations run, all ranks meet in a barrier,
// and -n timed iterations follow. The time reported is the slowest rank's
// average per iteration; algbw = size / time, busbw = algbw x 2(n-1)/n.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <oneapi/ccl.hpp>

#include "mpi_elements.h"

namespace {

using namespace mpi_bench;

struct Options : mpi_bench::SweepOptions {
  std::string redop = "sum";
};

struct Reduction {
  const char* name;
  ccl::reduction op;
};

const Reduction kOps[] = {{"sum", ccl::reduction::sum},
                          {"min", ccl::reduction::min},
                          {"max", ccl::reduction::max},
                          {"prod", ccl::reduction::prod}};

ccl::datatype ccl_type(const ElementType& t) {
  if (t.type == MPI_FLOAT) return ccl::datatype::float32;
  if (t.type == MPI_DOUBLE) return ccl::datatype::float64;
  if (t.type == MPI_INT32_T) return ccl::datatype::int32;
  if (t.type == MPI_INT64_T) return ccl::datatype::int64;
  return ccl::datatype::uint8;
}

double expected(const ElementType& t, const Reduction& r, int n, std::size_t i) {
  double acc = input(t, 0, i);
  for (int q = 1; q < n; ++q) {
    const double v = input(t, q, i);
    if (r.op == ccl::reduction::sum) acc += v;
    else if (r.op == ccl::reduction::prod) acc *= v;
    else if (r.op == ccl::reduction::min) acc = std::min(acc, v);
    else acc = std::max(acc, v);
  }
  if (t.type == MPI_UINT8_T) acc = static_cast<double>(static_cast<std::uint8_t>(static_cast<std::int64_t>(acc)));
  return acc;
}

// Products of many ranks overflow small types; check prod only where exact.
bool checkable(const ElementType& t, const Reduction& r, int n) {
  return r.op != ccl::reduction::prod || n <= 4 || t.type == MPI_DOUBLE || t.type == MPI_INT64_T;
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

Row measure(const Options& o, const ElementType& t, const Reduction& r, std::size_t bytes, int rank, int n,
            ccl::communicator& comm) {
  const ccl::datatype type = ccl_type(t);
  return measure_in_place(
      o, t, bytes, rank, checkable(t, r, n),
      [&](void* buf, std::size_t count) { ccl::allreduce(buf, buf, count, type, r.op, comm).wait(); },
      [&] { ccl::barrier(comm); }, [&](std::size_t i) { return expected(t, r, n, i); });
}

int run(const Options& o, int rank, int n) {
  const auto* type = std::find_if(std::begin(kTypes), std::end(kTypes), [&](const auto& t) { return o.dtype == t.name; });
  const auto* op = std::find_if(std::begin(kOps), std::end(kOps), [&](const auto& r) { return o.redop == r.name; });
  const std::size_t min_bytes = parse_size(o.min_bytes), max_bytes = parse_size(o.max_bytes);
  std::string problem;
  if (type == std::end(kTypes)) problem = "-d " + o.dtype + ": use float, double, int32, int64 or uint8";
  else if (op == std::end(kOps)) problem = "-o " + o.redop + ": use sum, min, max or prod";
  else problem = sweep_problem(o, min_bytes, max_bytes);
  if (!problem.empty()) {
    if (rank == 0) std::fprintf(stderr, "ccl_allreduce: %s\n", problem.c_str());
    return 2;
  }

  // oneCCL's communicator, bootstrapped through MPI: rank 0's main KVS
  // address, broadcast.
  ccl::init();
  ccl::shared_ptr_class<ccl::kvs> kvs;
  ccl::kvs::address_type address;
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    address = kvs->get_address();
  }
  MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(address);
  auto comm = ccl::create_communicator(n, rank, kvs);

  const ccl::library_version version = ccl::get_library_version();
  const std::string cpus = cpus_of_every_rank(rank, n);
  if (rank == 0) {
    std::printf("# ccl_allreduce: %d ranks, oneCCL %d.%d.%d (CCL_ATL_TRANSPORT=%s, FI_PROVIDER=%s), ccl::allreduce in "
                "place, %d iterations after %d warm-up, check %s\n",
                n, version.major, version.minor, version.update, env_or("CCL_ATL_TRANSPORT", "(default)").c_str(),
                env_or("FI_PROVIDER", "(any)").c_str(), o.iters, o.warmup, o.check ? "on" : "off");
    std::printf("# cpus:%s oneCCL workers on %s\n", cpus.c_str(), env_or("CCL_WORKER_AFFINITY", "(default)").c_str());
    print_table_head();
  }
  return sweep_allreduce(o, min_bytes, max_bytes, type->name, op->name, rank, n,
                         [&](std::size_t bytes) { return measure(o, *type, *op, bytes, rank, n, comm); });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"oneCCL allreduce benchmark with lockstep bench's options and table"};
  mpi_bench::add_sweep_options(app, o);
  app.add_option("-o,--op_type", o.redop, "sum, min, max, prod")->capture_default_str();
  // Parse before MPI_Init so --help works without mpiexec; every rank sees
  // the same command line, so every rank reaches the same verdict.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // oneCCL's worker threads may call MPI (CCL_ATL_TRANSPORT=mpi).
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int status = 0;
  try {
    status = run(o, rank, n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ccl_allreduce: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
