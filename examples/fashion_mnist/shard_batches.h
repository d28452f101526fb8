// A logical shard's batches (lockstep::torch::Shard, docs/faults.md), by
// step: each shard draws from its own DistributedSampler (the shard's index
// as its rank, seed 7, the last partial batch dropped), so a shard's
// samples are the same whichever rank computes them. Not thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "fashion_mnist/dataset.h"

namespace fashion_mnist {

class ShardBatches {
 public:
  // `data` outlives this object; `shards` logical shards of `per_shard`
  // samples each step.
  ShardBatches(Dataset& data, int shards, int per_shard);

  // Shard `shard`'s images and labels of global step `step` (epochs follow
  // one another: an epoch is the steps its sampler's order fills).
  std::pair<torch::Tensor, torch::Tensor> batch(int shard, std::uint64_t step);

 private:
  Dataset& data_;
  int shards_;
  int per_shard_;
  std::map<std::pair<int, std::uint64_t>, std::vector<std::size_t>> orders_;  // by (shard, epoch)
};

}  // namespace fashion_mnist
