// The mpi folder when lockstep is built without MPI (LOCKSTEP_WITH_MPI=OFF,
// or MPI not found): the same entry points, each saying how to get MPI.
// CMake compiles this file instead of the others; no #ifdef needed.
// Stateless; thread-safe.
#include "comm/backend.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

constexpr char kNoMpi[] = "this lockstep was built without MPI: install libopenmpi-dev and rebuild (make build)";

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(const BackendContext&) { throw ConfigError(kNoMpi); }

}  // namespace lockstep
