// DistributedSampler: which samples each rank sees, with PyTorch's
// semantics. Every epoch the dataset indices are shuffled (seed + epoch,
// identically on every rank) and dealt out round-robin, so shards are
// disjoint and together cover the dataset:
//   - default: the last shard is padded by repeating indices from the
//     start, so every rank gets the same count (ceil(n / ranks));
//   - drop_last: the tail that does not divide evenly is dropped instead;
//   - exact: no padding and no dropping: shards differ by at most one, and
//     every sample is seen exactly once (for evaluation).
// Resuming mid-epoch, possibly on another world size (an elastic job that
// lost or gained nodes): `resume_at` is how many samples of the epoch the
// job already trained on, over all ranks (steps done x per-rank batch x the
// old world size). Those are the first `resume_at` of the epoch's global
// order, whatever the world size was, since shards are dealt round-robin
// from it; the rest of that order is dealt to the new world with the same
// rules (padding, drop_last or exact, applied to the rest). So within the
// epoch no sample is skipped or repeated, beyond the padding.
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
  std::size_t resume_at = 0;  // samples of this epoch already done, over all ranks
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
  // How many indices this rank gets per epoch (after resume_at).
  std::size_t num_samples() const;
  // Indices over all ranks per epoch (after resume_at, padding or dropping).
  std::size_t total_size() const;
  const SamplerOptions& options() const { return options_; }

 private:
  std::size_t remaining() const;

  SamplerOptions options_;
  std::uint64_t epoch_ = 0;
};

// The permutation of 0..n-1 used for `seed` (exposed for tests and for
// programs that shuffle other things the same way).
std::vector<std::size_t> shuffled_indices(std::size_t n, std::uint64_t seed);

}  // namespace lockstep
