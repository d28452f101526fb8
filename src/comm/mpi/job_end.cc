// Finalise or abort MPI at exit; see job_end.h.
#include "comm/mpi/job_end.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "common/env_vars.h"

namespace lockstep::mpi {
namespace {

// mpirun's exit status after the abort, as if the rank had exited 1.
constexpr int kAbortCode = 1;

struct JobEnd {
  std::mutex mutex;
  bool lockstep_owns_mpi = false;
  bool abort_on_failure = true;
  std::string first_failure;  // empty: no group of this process failed
};

// Never destroyed: the exit hook reads it after static destructors may
// have run.
JobEnd& job_end() {
  static auto* state = new JobEnd;
  return *state;
}

// The whole message, its later lines indented under the first: a
// watchdog's verdict or the group's first failure follow the first line,
// and they say which rank caused it.
std::string message_of(std::exception_ptr error) {
  std::string text = "unknown error";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  std::string indented;
  for (const char c : text) {
    indented += c;
    if (c == '\n') indented += "  ";
  }
  return indented;
}

// Registered with std::atexit; runs after main returns or exit() is called.
// A program that finalised MPI itself is left alone.
void finalize_or_abort() {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (!initialised || finalized) return;
  std::string failure;
  {
    std::lock_guard lock(job_end().mutex);
    if (job_end().abort_on_failure) failure = job_end().first_failure;
  }
  if (failure.empty()) {
    MPI_Finalize();
    return;
  }
  // The failure itself was reported when it happened; this line says why
  // every other rank is about to be stopped.
  std::fputs(fmt::format("lockstep: a group of this process failed; ending the mpirun job with MPI_Abort so that no "
                         "rank is left running ({}=0 finalises MPI instead). The failure:\n  {}\n",
                         env::kMpiAbortOnFailure, failure)
                 .c_str(),
             stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, kAbortCode);
}

}  // namespace

void note_failed_group(std::exception_ptr error) {
  std::string line = message_of(error);
  std::lock_guard lock(job_end().mutex);
  if (job_end().first_failure.empty()) job_end().first_failure = std::move(line);
}

bool job_ends_with_abort() {
  std::lock_guard lock(job_end().mutex);
  return job_end().lockstep_owns_mpi && job_end().abort_on_failure && !job_end().first_failure.empty();
}

void end_mpi_at_exit(bool abort_on_failure) {
  {
    std::lock_guard lock(job_end().mutex);
    if (job_end().lockstep_owns_mpi) return;
    job_end().lockstep_owns_mpi = true;
    job_end().abort_on_failure = abort_on_failure;
  }
  std::atexit(finalize_or_abort);
}

}  // namespace lockstep::mpi
