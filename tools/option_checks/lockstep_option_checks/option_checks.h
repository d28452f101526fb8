// CLI11 validators for numeric options, shared by `lockstep` and the
// examples. CLI::Range and CLI::PositiveNumber let NaN through (every
// comparison with NaN is false) and print DBL_MAX in full in their
// messages, so floating-point options are checked here instead: a value
// must be finite and inside its range. Whole-number options are checked
// as 64-bit values, so "-5" cannot wrap into a huge unsigned count.
// CLI11 prefixes each message with the option's name.
// Stateless; thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

namespace lockstep::option_checks {

inline constexpr double kNoMax = std::numeric_limits<double>::max();

namespace detail {

inline std::string text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

// What a range accepts, in words: "a number from 0 to 3600", "a finite
// number above 0".
inline std::string accepted(double min, bool min_included, double max) {
  const std::string low = min_included ? "of " + text(min) + " or more" : "above " + text(min);
  if (max == kNoMax) return "a finite number " + low;
  if (min_included) return "a number from " + text(min) + " to " + text(max);
  return "a number " + low + ", up to " + text(max);
}

inline CLI::Validator finite_range(double min, bool min_included, double max) {
  const std::string words = accepted(min, min_included, max);
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        double v = 0;
        const bool ok = CLI::detail::lexical_cast(input, v) && std::isfinite(v) && (min_included ? v >= min : v > min) &&
                        v <= max;
        return ok ? std::string() : "'" + input + "' is not " + words;
      },
      words);
}

}  // namespace detail

// A finite number from `min` to `max`, both included.
inline CLI::Validator number_in(double min, double max) { return detail::finite_range(min, true, max); }

// A finite number above zero, up to `max` (learning rates, seconds, sizes).
inline CLI::Validator positive_number(double max = kNoMax) { return detail::finite_range(0, false, max); }

// A finite number of zero or more, up to `max`.
inline CLI::Validator non_negative_number(double max = kNoMax) { return detail::finite_range(0, true, max); }

// Whether `input` is a whole number written in decimal: CLI11 reads
// integers the way strtoll does with base 0, so "010" would be 8 and
// "0x10" 16, silently.
inline bool decimal(const std::string& input) {
  const std::size_t first = !input.empty() && (input[0] == '-' || input[0] == '+') ? 1 : 0;
  if (first == input.size()) return false;
  for (std::size_t i = first; i < input.size(); ++i)
    if (input[i] < '0' || input[i] > '9') return false;
  return input[first] != '0' || input.size() == first + 1;
}

// A whole number from `min` to `max` (counts, sizes, ranks), in decimal. A
// `max` that only keeps the value inside its type goes unsaid.
inline CLI::Validator whole_number_in(std::int64_t min, std::int64_t max) {
  const bool type_limit = max == std::numeric_limits<int>::max() || max == std::numeric_limits<std::int64_t>::max();
  const std::string words = type_limit ? "a whole number of " + std::to_string(min) + " or more"
                                       : "a whole number from " + std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        std::int64_t v = 0;
        const bool parsed = CLI::detail::lexical_cast(input, v);
        if (parsed && !decimal(input))  // octal or hex to CLI11
          return "'" + input + "' is not " + words + " written in decimal (no leading zeros, no 0x)";
        if (!parsed || v < min || (v > max && !type_limit)) return "'" + input + "' is not " + words;
        if (v > max) return "'" + input + "' is too large; the largest is " + std::to_string(max);
        return {};
      },
      words);
}

// A whole number of zero or more, for unsigned options (sizes, seeds).
inline CLI::Validator non_negative_whole_number() {
  return whole_number_in(0, std::numeric_limits<std::int64_t>::max());
}

// A count of one or more that fits an int.
inline CLI::Validator positive_count() { return whole_number_in(1, std::numeric_limits<int>::max()); }

// A count of zero or more that fits an int.
inline CLI::Validator non_negative_count() { return whole_number_in(0, std::numeric_limits<int>::max()); }

// Sizes in bytes as nccl-tests writes them: digits with an optional K, M
// or G (binary multiples), up to 1024G; "4", "64K", "32M", "1G". The one
// reading of a size for `lockstep bench`, `lockstep simulate` and the
// plain-MPI benchmark programs. nullopt: not a size.
inline constexpr std::uint64_t kMaxByteSize = std::uint64_t{1} << 40;
inline constexpr const char* kByteSizeWords = "bytes with an optional K, M or G, up to 1024G";

inline std::optional<std::uint64_t> byte_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t unit = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': unit = std::uint64_t{1} << 10; digits.pop_back(); break;
    case 'M': case 'm': unit = std::uint64_t{1} << 20; digits.pop_back(); break;
    case 'G': case 'g': unit = std::uint64_t{1} << 30; digits.pop_back(); break;
    default: break;
  }
  // At most 13 digits (1024G is 2^40, 13 digits), so the value cannot
  // overflow before it is bounded.
  if (digits.empty() || digits.size() > 13) return std::nullopt;
  for (const char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  const std::uint64_t value = std::stoull(digits);
  if (value > kMaxByteSize / unit) return std::nullopt;
  return value * unit;
}

// A CLI11 check that an option is such a size.
inline CLI::Validator byte_size_option() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        return byte_size(input) ? std::string() : "'" + input + "' is not a size; use " + kByteSizeWords;
      },
      "SIZE");
}

}  // namespace lockstep::option_checks
