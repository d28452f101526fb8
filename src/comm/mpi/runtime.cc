// MPI initialisation, finalisation and waiting; see runtime.h.
#include "comm/mpi/runtime.h"

#include <sched.h>

#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "comm/mpi/job_end.h"
#include "lockstep/error.h"

namespace lockstep::mpi {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

}  // namespace

bool initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

WorldPlace ensure_initialized(const std::string& who, bool abort_on_failure) {
  // MPI_Initialized followed by MPI_Init_thread must not race with another
  // thread doing the same; MPI's own state is per process, so is this lock.
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    throw ConfigError(fmt::format("{}: MPI was already finalised in this process and cannot be initialised again; "
                                  "finalise MPI only after the last lockstep group is destroyed",
                                  who));
  int provided = MPI_THREAD_SINGLE;
  if (!initialized()) {
    // Ask for every thread to be allowed to call MPI: each group waits on
    // its own progress thread, small operations run on the caller's thread
    // (see ProgressEngine), and groups run concurrently. A lower level
    // cannot be made safe by a lock here: FUNNELED and SINGLE forbid calls
    // from any thread but the main one, which is exactly where lockstep
    // does not run its collectives.
    // Registered first: the hook does nothing if MPI never starts.
    end_mpi_at_exit(abort_on_failure);
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      throw ConfigError(fmt::format("{}: MPI_Init_thread failed; run the program under mpirun", who));
    if (provided < MPI_THREAD_MULTIPLE)
      throw ConfigError(fmt::format("{}: this MPI library gives only {} but lockstep needs MPI_THREAD_MULTIPLE (its "
                                    "groups call MPI from several threads); use an MPI built with thread support "
                                    "(Open MPI 3 or later is) or another backend (LOCKSTEP_BACKEND=auto)",
                                    who, thread_level_name(provided)));
  } else {
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE)
      throw ConfigError(fmt::format("{}: the program initialised MPI with {}, but lockstep calls MPI from several "
                                    "threads; initialise it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                                    "or let lockstep initialise it",
                                    who, thread_level_name(provided)));
  }
  WorldPlace place;
  MPI_Comm_rank(MPI_COMM_WORLD, &place.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &place.size);
  return place;
}

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

WaitOutcome test_until(MPI_Request& request, Deadline deadline, std::chrono::nanoseconds spin, bool yield,
                       MPI_Status* status) {
  WaitOutcome out;
  int done = 0;
  out.error = MPI_Test(&request, &done, status);
  if (out.error != MPI_SUCCESS || done) {
    out.done = out.error == MPI_SUCCESS;
    return out;
  }
  const auto spin_until = Clock::now() + spin;
  for (;;) {
    out.error = MPI_Test(&request, &done, status);
    if (out.error != MPI_SUCCESS) return out;
    if (done) {
      out.done = true;
      return out;
    }
    const auto now = Clock::now();
    if (!deadline.is_never() && now >= deadline.at()) return out;
    if (now < spin_until) {
      if (yield) sched_yield();
      continue;
    }
    std::this_thread::sleep_for(kNap);
  }
}

}  // namespace lockstep::mpi
