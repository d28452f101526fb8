// Where each parameter of a fully sharded unit lives: the unit's parameters
// are laid end to end in one flat buffer, padded so that it splits into
// world_size equal shards, and rank r keeps the r-th shard. A parameter may
// cross shard boundaries; each rank holds the pieces of it that fall in its
// shard. The layout is pure arithmetic, the same on every rank, and knows
// nothing of tensors (the libtorch frontend's fully_shard and `lockstep
// simulate` both use it).
//
//   ShardLayout layout({300, 20, 7}, /*world_size=*/4);
//   layout.shard_elements();             // 82: (327 + padding) / 4
//   layout.pieces_of(1)                  // rank 1's pieces: parameter 0's elements 82..163
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep {

// A contiguous run of one parameter's (flattened) elements inside one
// rank's shard.
struct ShardPiece {
  std::size_t param = 0;             // index into the parameter list
  std::int64_t param_offset = 0;     // first element, within the parameter
  std::int64_t shard_offset = 0;     // where it starts in the rank's shard
  std::int64_t count = 0;
};

class ShardLayout {
 public:
  // `numels`: each parameter's element count, in the order they are laid
  // out. `extra_per_shard`: padding every shard carries beyond what the
  // split needs (fully_shard gives each unit a distinct shard size with it,
  // so that ranks gathering different units fail on the collective's count
  // instead of exchanging each other's parameters).
  ShardLayout(std::vector<std::int64_t> numels, int world_size, std::int64_t extra_per_shard = 0);

  int world_size() const { return world_size_; }
  std::size_t params() const { return numels_.size(); }
  std::int64_t numel(std::size_t param) const { return numels_.at(param); }
  // Where parameter `param` starts in the flat (unsharded) buffer.
  std::int64_t flat_offset(std::size_t param) const { return offsets_.at(param); }
  // Elements of all parameters, without padding.
  std::int64_t data_elements() const { return data_elements_; }
  // Elements of each shard; the flat buffer holds world_size() of them.
  std::int64_t shard_elements() const { return shard_elements_; }
  std::int64_t flat_elements() const { return shard_elements_ * world_size_; }
  // Rank `rank`'s pieces, in shard order (and so in parameter order).
  std::vector<ShardPiece> pieces_of(int rank) const;
  // Rank `rank`'s piece of parameter `param` (count 0 when it holds none).
  ShardPiece piece_of(int rank, std::size_t param) const;

 private:
  std::vector<std::int64_t> numels_;
  std::vector<std::int64_t> offsets_;
  int world_size_ = 1;
  std::int64_t data_elements_ = 0;
  std::int64_t shard_elements_ = 0;
};

}  // namespace lockstep
