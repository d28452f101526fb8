#include "ddp/shard_layout.h"

#include <algorithm>

#include "lockstep/error.h"

namespace lockstep {

ShardLayout::ShardLayout(std::vector<std::int64_t> numels, int world_size, std::int64_t extra_per_shard)
    : numels_(std::move(numels)), world_size_(world_size) {
  if (world_size < 1) throw InvalidArgument("a shard layout needs a world size of at least 1");
  if (extra_per_shard < 0) throw InvalidArgument("a shard layout's extra padding cannot be negative");
  offsets_.reserve(numels_.size());
  for (const std::int64_t n : numels_) {
    if (n < 0) throw InvalidArgument("a parameter cannot have a negative element count");
    offsets_.push_back(data_elements_);
    data_elements_ += n;
  }
  shard_elements_ = (data_elements_ + world_size_ - 1) / world_size_ + extra_per_shard;
}

ShardPiece ShardLayout::piece_of(int rank, std::size_t param) const {
  const std::int64_t shard_begin = shard_elements_ * rank;
  const std::int64_t shard_end = shard_begin + shard_elements_;
  const std::int64_t begin = std::max(offsets_.at(param), shard_begin);
  const std::int64_t end = std::min(offsets_[param] + numels_[param], shard_end);
  if (end <= begin) return ShardPiece{param, 0, 0, 0};
  return ShardPiece{param, begin - offsets_[param], begin - shard_begin, end - begin};
}

std::vector<ShardPiece> ShardLayout::pieces_of(int rank) const {
  if (rank < 0 || rank >= world_size_) throw InvalidArgument("rank out of range for this shard layout");
  std::vector<ShardPiece> pieces;
  for (std::size_t i = 0; i < numels_.size(); ++i) {
    const ShardPiece piece = piece_of(rank, i);
    if (piece.count > 0) pieces.push_back(piece);
  }
  return pieces;
}

}  // namespace lockstep
