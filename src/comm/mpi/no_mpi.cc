// The mpi folder when lockstep is built without MPI (LOCKSTEP_WITH_MPI=OFF,
// or MPI not found): the same entry points, each saying how to get MPI.
// CMake compiles this file instead of the others; no #ifdef needed.
// Stateless; thread-safe.
#include <fmt/format.h>

#include "comm/backend.h"
#include "comm/mpi/bootstrap.h"
#include "comm/mpi/job_end.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr char kNoMpi[] = "this lockstep was built without MPI: install libopenmpi-dev and rebuild (make build)";

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(const BackendContext& ctx) {
  throw ConfigError(fmt::format("rank {}/{}: {}", ctx.rank, ctx.size, kNoMpi));
}

BootstrappedStore bootstrap_store_with_mpi(const LaunchInfo& launch, TcpStoreOptions) {
  throw ConfigError(fmt::format("rank {} of {} was started by mpirun without MASTER_ADDR and MASTER_PORT, and {}, "
                                "or set MASTER_ADDR and MASTER_PORT",
                                launch.rank, launch.world_size, kNoMpi));
}

namespace mpi {

// Without MPI no process ends an MPI job: failures need no record.
void note_failed_group(std::exception_ptr) {}
bool job_ends_with_abort() { return false; }

}  // namespace mpi
}  // namespace lockstep
