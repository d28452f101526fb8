// The process's MPI library, shared by every mpi-backend group and the
// mpirun bootstrap: initialisation (with MPI_THREAD_MULTIPLE), finalisation
// at exit, MPI's error texts, and the deadline-bounded wait on a request.
//
// Global state, forced by MPI: MPI is initialised at most once per process
// and can never be initialised again after MPI_Finalize, so whether lockstep
// started it (and must end it) is a fact about the process, not about a
// group. It is kept in one function-local mutex and, for the end, in
// job_end.h's state and atexit hook.
// Thread-safe.
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>

#include "common/clock.h"

namespace lockstep::mpi {

// This process's place in MPI_COMM_WORLD.
struct WorldPlace {
  int rank = 0;
  int size = 1;
};

bool initialized();

// Initialises MPI unless it already is, asking for MPI_THREAD_MULTIPLE
// (groups call MPI from their progress threads and from callers' threads
// at once), and returns this process's place. When lockstep initialises
// MPI it also ends it, once, at process exit (std::atexit), so a program
// may destroy its groups and form new ones at any time: MPI_Finalize, or
// MPI_Abort after a group failed (job_end.h). When the program initialised
// MPI itself, it keeps that duty. `who` ("rank 1/4")
// starts error messages; `abort_on_failure` is Config::mpi_abort_on_failure. Throws ConfigError: MPI already finalised, or
// initialised by the program with less than MPI_THREAD_MULTIPLE, or built
// without thread support.
WorldPlace ensure_initialized(const std::string& who, bool abort_on_failure);

// MPI's description of an error code.
std::string error_text(int code);

struct WaitOutcome {
  bool done = false;
  int error = MPI_SUCCESS;  // MPI's code when the test itself failed
};

// Polls `request` with MPI_Test until it completes, fails or `deadline`
// passes. The wait first spins (testing in a loop) for `spin`, about as
// long as the transfer itself should take; after that a peer is probably
// late, and the wait naps kNap between tests, so a waiting progress thread
// leaves the core to compute (a long wait costs about 15% of a core instead
// of all of it). The nap stays short and does not grow: Open MPI moves data
// only inside MPI calls on both sides (its shared-memory transport without
// single-copy forwards a large message fragment by fragment), so a transfer
// that outlasts the spin goes on at the pace of the tests. Measured: naps
// growing to 1 ms made the no-single-copy sweep 7x slower. With `yield`
// (ranks outnumber cores) every spinning test also gives the core away.
// `status`, if given, receives the completed request's status (a receive
// from MPI_ANY_SOURCE learns its sender there).
inline constexpr std::chrono::microseconds kNap{50};
WaitOutcome test_until(MPI_Request& request, Deadline deadline, std::chrono::nanoseconds spin, bool yield,
                       MPI_Status* status = MPI_STATUS_IGNORE);

}  // namespace lockstep::mpi
