// Memory deliberately never freed: what an operation MPI cannot cancel may
// still write into after its group has gone (mpi_backend.cc). Moved to the
// heap and dropped; LeakSanitizer is told that this one is on purpose, so a
// real leak still fails `make test-asan`.
#pragma once

#include <type_traits>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#define LOCKSTEP_HAS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOCKSTEP_HAS_LSAN 1
#endif
#endif
#ifdef LOCKSTEP_HAS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace lockstep {

// Moves `value` to memory that lives until the process exits.
template <typename T>
void keep_until_exit(T&& value) {
  auto* kept = new std::decay_t<T>(std::forward<T>(value));
#ifdef LOCKSTEP_HAS_LSAN
  __lsan_ignore_object(kept);
#else
  static_cast<void>(kept);
#endif
}

}  // namespace lockstep
