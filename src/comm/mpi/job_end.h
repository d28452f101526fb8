// How a process ends the MPI that lockstep initialised: MPI_Finalize after
// a clean run, MPI_Abort once any group of the process has failed.
//
// Why: mpirun ends a job early only when a rank ends abnormally. A rank that
// reports a lockstep failure and exits 1 after MPI_Finalize does not count,
// so the job would run on until every other rank ended by itself, and the
// rank that caused the failure is often stuck outside lockstep (in a long
// sleep, in data loading). MPI_Abort makes mpirun stop every rank at once,
// as `lockstep run` does when a rank fails.
//
// The decision is made at process exit, not at the failure: the program
// still gets the exception, prints it, and may save what it needs first.
// It applies only where lockstep initialised MPI; a program that did so
// itself also finalises it and decides how (docs/errors.md).
//
// Declared without MPI types, so the comm layer can record failures: built
// from job_end.cc with MPI, or from no_mpi.cc, where it does nothing.
// Process-wide state, as MPI's own is (see runtime.h). Thread-safe.
#pragma once

#include <exception>

namespace lockstep::mpi {

// Records that a group of this process failed with `error` (the first one
// is kept, for the line printed before MPI_Abort). Cheap, and harmless when
// the process does not use MPI.
void note_failed_group(std::exception_ptr error);

// True when this process will end MPI with MPI_Abort at exit: lockstep
// initialised MPI, a group failed, and LOCKSTEP_MPI_ABORT_ON_FAILURE is not 0.
bool job_ends_with_abort();

// Called once by ensure_initialized when lockstep itself initialises MPI:
// registers the exit hook that finalises, or aborts after a failure when
// `abort_on_failure` (Config::mpi_abort_on_failure).
void end_mpi_at_exit(bool abort_on_failure);

}  // namespace lockstep::mpi
