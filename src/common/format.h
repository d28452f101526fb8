// fmt formatters for lockstep's vocabulary types, so messages can say
// fmt::format("{} of {}", collective, dtype). Stateless; thread-safe.
#pragma once

#include <fmt/format.h>

#include "lockstep/types.h"

template <>
struct fmt::formatter<lockstep::DType> : fmt::formatter<std::string_view> {
  auto format(lockstep::DType v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(lockstep::to_string(v), ctx);
  }
};
template <>
struct fmt::formatter<lockstep::ReduceOp> : fmt::formatter<std::string_view> {
  auto format(lockstep::ReduceOp v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(lockstep::to_string(v), ctx);
  }
};
template <>
struct fmt::formatter<lockstep::Collective> : fmt::formatter<std::string_view> {
  auto format(lockstep::Collective v, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(lockstep::to_string(v), ctx);
  }
};
