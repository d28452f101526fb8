// See allreduce_paths.h.
#include "comm/shm/allreduce_paths.h"

#include <algorithm>
#include <bit>

namespace lockstep::shm {
namespace {

constexpr std::size_t index_of(AllreducePaths::Path path) { return static_cast<std::size_t>(path); }

}  // namespace

std::optional<AllreducePaths::Path> AllreducePaths::forced(std::uint64_t n) {
  if (n % kRefreshEvery == kRefreshEvery - 1) return Path::slots;
  if (n % kRefreshEvery == kRefreshEvery / 2 - 1) return Path::single_copy;
  return std::nullopt;
}

std::size_t AllreducePaths::size_class(std::size_t bytes) {
  const std::size_t log2 = bytes == 0 ? 0 : static_cast<std::size_t>(std::bit_width(bytes) - 1);
  return std::min(log2 / 2, kClasses - 1);
}

AllreducePaths::Path AllreducePaths::vote(std::size_t bytes) const {
  const auto& costs = cost_[size_class(bytes)];
  const double slots = costs[index_of(Path::slots)], single = costs[index_of(Path::single_copy)];
  if (slots == 0) return Path::slots;
  if (single == 0) return Path::single_copy;
  return single < slots ? Path::single_copy : Path::slots;
}

AllreducePaths::Path AllreducePaths::decide(const std::int64_t* votes, int n) {
  const auto for_single_copy =
      std::count(votes, votes + n, static_cast<std::int64_t>(Path::single_copy));
  return 2 * for_single_copy > n ? Path::single_copy : Path::slots;
}

void AllreducePaths::record(Path path, std::size_t bytes, std::int64_t nanos) {
  if (bytes == 0) return;
  const double measured = std::max<double>(1.0, static_cast<double>(nanos)) / static_cast<double>(bytes);
  double& cost = cost_[size_class(bytes)][index_of(path)];
  cost = cost == 0 ? measured : cost + kWeight * (measured - cost);
}

double AllreducePaths::cost_per_byte(Path path, std::size_t bytes) const {
  return cost_[size_class(bytes)][index_of(path)];
}

}  // namespace lockstep::shm
