// Reference inputs and results for collective tests. Inputs are small
// integers, so every reduction is exact in every dtype and the expected
// result is known bit for bit, whatever order a backend reduces in.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/format.h"
#include "common/half.h"
#include "lockstep/types.h"

namespace lockstep::testing {

// The value rank r contributes at index i, as a double (before conversion).
inline double input_value(int r, std::size_t i, ReduceOp op) {
  if (op == ReduceOp::prod) {
    // Factors 2, 1, -1: products of up to 8 ranks stay within 2^8, exact in bf16.
    switch ((static_cast<std::size_t>(r) + i) % 3) {
      case 0: return 2;
      case 1: return 1;
      default: return -1;
    }
  }
  return static_cast<double>((static_cast<std::size_t>(r) * 7 + i * 13) % 11) - 5;  // -5..5
}

// Element access as doubles: one conversion, shared with the library
// (lockstep/types.h).
inline void store_value(void* buf, DType dtype, std::size_t i, double v) { store_from_double(buf, dtype, i, v); }
inline double load_value(const void* buf, DType dtype, std::size_t i) { return load_as_double(buf, dtype, i); }

// input_value repeats along the index every 11 elements ((7r + 13i) mod
// 11), or every 3 for prod, so inputs and expected results repeat every 33:
// a buffer is filled by converting one period and copying it along. The
// sweeps' million-element cases then cost copies, not a conversion per
// element per case (which was most of the sweep's time).
inline constexpr std::size_t kValuePeriod = 33;

// Fills `count` elements of `elem` bytes at `buf`: store_one(i) for the
// first period, then copies of it (each copy starts at a multiple of the
// period, so element i ends up equal to what store_one(i) would store).
template <class StoreOne>
void fill_periodic(std::byte* buf, std::size_t count, std::size_t elem, StoreOne&& store_one) {
  const std::size_t head = std::min(count, kValuePeriod);
  for (std::size_t i = 0; i < head; ++i) store_one(i);
  for (std::size_t done = head; done < count;) {
    const std::size_t n = std::min(done, count - done);
    std::memcpy(buf + done * elem, buf, n * elem);
    done += n;
  }
}

// Fills rank r's buffer with its inputs for `op`.
inline std::vector<std::byte> make_input(int r, std::size_t count, DType dtype, ReduceOp op) {
  std::vector<std::byte> buf(count * dtype_size(dtype) + 1);  // +1: never a zero-size allocation
  fill_periodic(buf.data(), count, dtype_size(dtype),
                [&](std::size_t i) { store_value(buf.data(), dtype, i, input_value(r, i, op)); });
  return buf;
}

// The expected reduction of index `index` over `n` ranks, stored at element
// `pos` of a buffer of `dtype` the way a correct implementation must produce
// it: integer sums and products wrap in the element type, avg divides the
// (wrapped) sum by n, truncating for integers, and floats are exact until
// the final division (done in fp32, or fp64 for f64).
inline void store_expected_at(void* buf, DType dtype, std::size_t pos, std::size_t index, int n, ReduceOp op) {
  const bool integral = !is_floating(dtype);
  const auto wrap = [dtype](std::int64_t v) -> std::int64_t {
    if (dtype == DType::u8) return static_cast<std::uint8_t>(v);
    if (dtype == DType::i32) return static_cast<std::int32_t>(v);
    return v;
  };
  // Integer inputs are what the element type holds (e.g. -5 is 251 in u8).
  const auto input = [&](int r) {
    const double v = input_value(r, index, op);
    return integral ? static_cast<double>(wrap(static_cast<std::int64_t>(v))) : v;
  };
  double result = input(0);
  std::int64_t iresult = static_cast<std::int64_t>(result);
  for (int r = 1; r < n; ++r) {
    const double v = input(r);
    const auto iv = static_cast<std::int64_t>(v);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        result += v;
        iresult = wrap(iresult + iv);
        break;
      case ReduceOp::prod:
        result *= v;
        iresult = wrap(static_cast<std::int64_t>(static_cast<std::uint64_t>(iresult) * static_cast<std::uint64_t>(iv)));
        break;
      case ReduceOp::min:
        result = std::min(result, v);
        iresult = std::min(iresult, iv);
        break;
      case ReduceOp::max:
        result = std::max(result, v);
        iresult = std::max(iresult, iv);
        break;
    }
  }
  if (integral) {
    if (op == ReduceOp::avg) iresult = iresult / n;
    store_value(buf, dtype, pos, static_cast<double>(iresult));
    return;
  }
  if (op == ReduceOp::avg) {
    if (dtype == DType::f64)
      result = result / n;
    else
      result = static_cast<double>(static_cast<float>(result) / static_cast<float>(n));
  }
  store_value(buf, dtype, pos, result);
}

inline void store_expected(void* buf, DType dtype, std::size_t i, int n, ReduceOp op) {
  store_expected_at(buf, dtype, i, i, n, op);
}

// The expected reductions of indices first_index .. first_index + count - 1
// over `n` ranks, in a buffer of `count` elements (+1 byte, as make_input's).
inline std::vector<std::byte> expected_results(DType dtype, std::size_t count, std::size_t first_index, int n,
                                               ReduceOp op) {
  std::vector<std::byte> buf(count * dtype_size(dtype) + 1);
  fill_periodic(buf.data(), count, dtype_size(dtype),
                [&](std::size_t i) { store_expected_at(buf.data(), dtype, i, first_index + i, n, op); });
  return buf;
}

// Compares element by element; returns "" or a description of the first
// mismatches.
inline std::string compare_elements(const void* got, const void* want, std::size_t count, DType dtype) {
  const std::size_t elem = dtype_size(dtype);
  if (count == 0 || std::memcmp(got, want, count * elem) == 0) return "";
  std::string out;
  int shown = 0;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * elem, static_cast<const char*>(want) + i * elem, elem) == 0)
      continue;
    ++wrong;
    if (shown++ < 5)
      out += fmt::format(" [{}] got {} want {};", i, load_value(got, dtype, i), load_value(want, dtype, i));
  }
  if (wrong == 0) return "";
  return fmt::format("{} of {} {} elements wrong:{}", wrong, count, dtype, out);
}

}  // namespace lockstep::testing
