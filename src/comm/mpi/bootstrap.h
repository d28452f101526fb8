// The rendezvous store of a job started by mpirun alone (no MASTER_ADDR /
// MASTER_PORT): rank 0 starts a TcpStoreServer on a free port and
// broadcasts "host, port, token" with MPI; every rank then connects a
// TcpStore client, and rendezvous goes on as usual with any backend.
// Declared without MPI types: built from bootstrap.cc with MPI, or from
// no_mpi.cc, which throws ConfigError saying how to get MPI.
// Thread-safe, but a collective on MPI_COMM_WORLD: call it from one thread
// at a time on every rank (init_process_group does).
#pragma once

#include <memory>

#include "comm/backend_registry.h"
#include "comm/launch_env.h"
#include "lockstep/store.h"

namespace lockstep {

// Initialises MPI if needed (see mpi/runtime.h). `launch` must come from
// Open MPI's variables; `options` are the store's (timeouts, and the token
// when LOCKSTEP_STORE_TOKEN is set; else rank 0 draws a random one).
// Throws ConfigError (built without MPI, MPI's world disagrees with the
// launcher's variables, rank 0 could not start the server) or TimeoutError
// (rank 0 did not answer within the connect timeout).
BootstrappedStore bootstrap_store_with_mpi(const LaunchInfo& launch, TcpStoreOptions options);

}  // namespace lockstep
