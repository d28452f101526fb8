// Invariant checks that print both operands, in the manner of gloo's ENFORCE:
//   LOCKSTEP_ENFORCE_EQ(got, want, "bucket {} size", i)  ->
//   "src/ddp/reducer.cc:88: bucket 3 size: expected got == want, 12 vs 16"
// ENFORCE throws lockstep::Error (a broken invariant: a bug in lockstep),
// naming the source line (relative to the source tree: the build maps
// its own path away) and the condition, for the bug report;
// LOCKSTEP_CHECK_ARG throws InvalidArgument (a caller's mistake) with the
// message alone: the caller needs what was wrong with the call, not where
// in lockstep it was noticed.
// Stateless; thread-safe.
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>

#include "lockstep/error.h"

namespace lockstep::detail {

template <typename E>
[[noreturn]] void throw_enforce(const char* file, int line, const std::string& what) {
  throw E(fmt::format("{}:{}: {}", file, line, what));
}

template <typename... Args>
std::string optional_message(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...) + ": ";
}
inline std::string optional_message() { return {}; }

}  // namespace lockstep::detail

#define LOCKSTEP_ENFORCE_IMPL(E, cond, ...)                                              \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      ::lockstep::detail::throw_enforce<E>(                                              \
          __FILE__, __LINE__,                                                            \
          ::lockstep::detail::optional_message(__VA_ARGS__) + "expected " #cond);        \
    }                                                                                    \
  } while (0)

#define LOCKSTEP_ENFORCE_CMP_IMPL(E, a, b, op, ...)                                      \
  do {                                                                                   \
    const auto& lockstep_a_ = (a);                                                       \
    const auto& lockstep_b_ = (b);                                                       \
    if (!(lockstep_a_ op lockstep_b_)) [[unlikely]] {                                    \
      ::lockstep::detail::throw_enforce<E>(                                              \
          __FILE__, __LINE__,                                                            \
          ::lockstep::detail::optional_message(__VA_ARGS__) +                            \
              fmt::format("expected " #a " " #op " " #b ", {} vs {}", lockstep_a_,       \
                          lockstep_b_));                                                 \
    }                                                                                    \
  } while (0)

#define LOCKSTEP_ENFORCE(cond, ...) LOCKSTEP_ENFORCE_IMPL(::lockstep::Error, cond, __VA_ARGS__)
#define LOCKSTEP_ENFORCE_EQ(a, b, ...) LOCKSTEP_ENFORCE_CMP_IMPL(::lockstep::Error, a, b, ==, __VA_ARGS__)
#define LOCKSTEP_ENFORCE_NE(a, b, ...) LOCKSTEP_ENFORCE_CMP_IMPL(::lockstep::Error, a, b, !=, __VA_ARGS__)
#define LOCKSTEP_ENFORCE_LT(a, b, ...) LOCKSTEP_ENFORCE_CMP_IMPL(::lockstep::Error, a, b, <, __VA_ARGS__)
#define LOCKSTEP_ENFORCE_LE(a, b, ...) LOCKSTEP_ENFORCE_CMP_IMPL(::lockstep::Error, a, b, <=, __VA_ARGS__)
#define LOCKSTEP_ENFORCE_GE(a, b, ...) LOCKSTEP_ENFORCE_CMP_IMPL(::lockstep::Error, a, b, >=, __VA_ARGS__)

#define LOCKSTEP_CHECK_ARG(cond, ...)                                                    \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] throw ::lockstep::InvalidArgument(fmt::format(__VA_ARGS__)); \
  } while (0)
