// See ordinary_paths.h.
#include "comm/shm/ordinary_paths.h"

#include <algorithm>
#include <bit>

namespace lockstep::shm {
namespace {

constexpr std::size_t index_of(OrdinaryPaths::Path path) { return static_cast<std::size_t>(path); }

}  // namespace

double OrdinaryPaths::Measurements::least() const {
  if (count == 0) return 0;
  return *std::min_element(per_byte.begin(), per_byte.begin() + static_cast<std::ptrdiff_t>(std::min(count, kWindow)));
}

std::optional<OrdinaryPaths::Path> OrdinaryPaths::forced(std::uint64_t n) {
  if (n % kRefreshEvery == kRefreshEvery - 1) return Path::slots;
  if (n % kRefreshEvery == kRefreshEvery / 2 - 1) return Path::single_copy;
  return std::nullopt;
}

std::size_t OrdinaryPaths::size_class(std::size_t bytes) {
  const std::size_t log2 = bytes == 0 ? 0 : static_cast<std::size_t>(std::bit_width(bytes) - 1);
  return std::min(log2 / 2, kClasses - 1);
}

OrdinaryPaths::Path OrdinaryPaths::vote(std::size_t bytes) const {
  const auto& at = measured_[size_class(bytes)];
  const Measurements& slots = at[index_of(Path::slots)];
  const Measurements& single = at[index_of(Path::single_copy)];
  if (slots.count < kFirst && slots.count <= single.count) return Path::slots;
  if (single.count < kFirst) return Path::single_copy;
  if (slots.count < kFirst) return Path::slots;
  return single.least() < kMargin * slots.least() ? Path::single_copy : Path::slots;
}

OrdinaryPaths::Path OrdinaryPaths::decide(const std::int64_t* votes, int n) {
  const auto for_single_copy = std::count(votes, votes + n, static_cast<std::int64_t>(Path::single_copy));
  return 2 * for_single_copy > n ? Path::single_copy : Path::slots;
}

void OrdinaryPaths::record(Path path, std::size_t bytes, std::int64_t nanos) {
  if (bytes == 0) return;
  Measurements& m = measured_[size_class(bytes)][index_of(path)];
  m.per_byte[m.count % kWindow] = std::max<double>(1.0, static_cast<double>(nanos)) / static_cast<double>(bytes);
  ++m.count;
}

double OrdinaryPaths::cost_per_byte(Path path, std::size_t bytes) const {
  return measured_[size_class(bytes)][index_of(path)].least();
}

}  // namespace lockstep::shm
