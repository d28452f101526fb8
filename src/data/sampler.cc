// DistributedSampler; see lockstep/sampler.h.
#include "lockstep/sampler.h"

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep {
namespace {

// splitmix64: a tiny, well-distributed generator with a fixed definition.
std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A uniform value in [0, bound) without modulo bias (Lemire's method).
std::uint64_t below(std::uint64_t& state, std::uint64_t bound) {
  for (;;) {
    const unsigned __int128 m = static_cast<unsigned __int128>(next(state)) * bound;
    const auto low = static_cast<std::uint64_t>(m);
    if (low >= bound || low >= (0 - bound) % bound) return static_cast<std::uint64_t>(m >> 64);
  }
}

}  // namespace

std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  std::uint64_t state = seed;
  for (std::size_t i = n; i > 1; --i) std::swap(v[i - 1], v[below(state, i)]);
  return v;
}

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas)
    throw InvalidArgument(fmt::format("DistributedSampler: rank {} is not in 0..{}", options_.rank,
                                      options_.num_replicas - 1));
  if (options_.exact && options_.drop_last)
    throw InvalidArgument("DistributedSampler: exact (every sample once) and drop_last contradict each other");
}

// Samples of the epoch still to be dealt out.
std::size_t DistributedSampler::remaining() const {
  return options_.dataset_size - std::min(options_.resume_at, options_.dataset_size);
}

std::size_t DistributedSampler::num_samples() const {
  const std::size_t n = remaining();
  const auto r = static_cast<std::size_t>(options_.num_replicas);
  const auto rank = static_cast<std::size_t>(options_.rank);
  if (options_.exact) return n / r + (rank < n % r ? 1 : 0);
  if (options_.drop_last) return n / r;
  return (n + r - 1) / r;
}

std::size_t DistributedSampler::total_size() const {
  const std::size_t n = remaining();
  const auto r = static_cast<std::size_t>(options_.num_replicas);
  if (options_.exact) return n;
  return options_.drop_last ? n / r * r : (n + r - 1) / r * r;
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> all;
  if (options_.shuffle) {
    all = shuffled_indices(options_.dataset_size, options_.seed + epoch_);
  } else {
    all.resize(options_.dataset_size);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  }
  // What the job trained on before it resumed is the start of that order.
  all.erase(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(options_.dataset_size - remaining()));
  const std::size_t n = all.size();
  const std::size_t total = total_size();
  if (total > n && n > 0) {
    // Pad by repeating from the start (more than once if padding > n).
    for (std::size_t i = 0; all.size() < total; ++i) all.push_back(all[i % n]);
  }
  all.resize(std::min(all.size(), total));
  std::vector<std::size_t> mine;
  mine.reserve(num_samples());
  for (std::size_t i = static_cast<std::size_t>(options_.rank); i < all.size();
       i += static_cast<std::size_t>(options_.num_replicas))
    mine.push_back(all[i]);
  return mine;
}

}  // namespace lockstep
