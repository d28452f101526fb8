#include "fashion_mnist/shard_batches.h"

#include <lockstep/sampler.h>

#include <stdexcept>
#include <string>

namespace fashion_mnist {

ShardBatches::ShardBatches(Dataset& data, int shards, int per_shard)
    : data_(data), shards_(shards), per_shard_(per_shard) {
  const std::size_t per_epoch = *data_.size() / static_cast<std::size_t>(shards_) / static_cast<std::size_t>(per_shard_);
  if (per_epoch == 0)
    throw std::invalid_argument("the data set's " + std::to_string(*data_.size()) + " samples make no batch of " +
                                std::to_string(per_shard_) + " for each of " + std::to_string(shards_) +
                                " shards: use more samples (--subset) or a smaller batch");
}

std::pair<torch::Tensor, torch::Tensor> ShardBatches::batch(int shard, std::uint64_t step) {
  const std::size_t per_epoch = *data_.size() / static_cast<std::size_t>(shards_) / static_cast<std::size_t>(per_shard_);
  const std::uint64_t epoch = step / per_epoch;
  auto& order = orders_[{shard, epoch}];
  if (order.empty()) {
    lockstep::DistributedSampler sampler(
        {.dataset_size = *data_.size(), .num_replicas = shards_, .rank = shard, .seed = 7, .drop_last = true});
    sampler.set_epoch(epoch);
    order = sampler.indices();
  }
  std::vector<torch::Tensor> xs, ys;
  const std::size_t first = (step % per_epoch) * static_cast<std::size_t>(per_shard_);
  for (std::size_t i = first; i < first + static_cast<std::size_t>(per_shard_); ++i) {
    auto example = data_.get(order[i]);
    xs.push_back(example.data);
    ys.push_back(example.target);
  }
  return {torch::stack(xs), torch::stack(ys)};
}

}  // namespace fashion_mnist
