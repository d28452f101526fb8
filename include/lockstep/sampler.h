// DistributedSampler: which samples each rank sees, with PyTorch's
// semantics. Every epoch the dataset indices are shuffled (seed + epoch,
// identically on every rank) and dealt out round-robin, so shards are
// disjoint and together cover the dataset:
//   - default: the last shard is padded by repeating indices from the
//     start, so every rank gets the same count (ceil(n / ranks));
//   - drop_last: the tail that does not divide evenly is dropped instead;
//   - exact: no padding and no dropping: shards differ by at most one, and
//     every sample is seen exactly once (for evaluation).
// The shuffle is a Fisher-Yates driven by splitmix64, defined here, so it
// is the same on every platform and compiler.
// A value; thread-safe for concurrent const use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep {

struct SamplerOptions {
  std::size_t dataset_size = 0;
  int num_replicas = 1;
  int rank = 0;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
  bool exact = false;
};

class DistributedSampler {
 public:
  // Throws InvalidArgument for a rank outside 0..num_replicas-1 or
  // incompatible options (drop_last with exact).
  explicit DistributedSampler(SamplerOptions options);

  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, in order.
  std::vector<std::size_t> indices() const;
  // How many indices this rank gets per epoch.
  std::size_t num_samples() const;
  // Indices over all ranks per epoch (after padding or dropping).
  std::size_t total_size() const;
  const SamplerOptions& options() const { return options_; }

 private:
  SamplerOptions options_;
  std::uint64_t epoch_ = 0;
};

// The permutation of 0..n-1 used for `seed` (exposed for tests and for
// programs that shuffle other things the same way).
std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed);

}  // namespace lockstep
