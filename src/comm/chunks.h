// Splitting a buffer of elements into n nearly equal chunks, the unit of
// work of reduce-scatter style algorithms in every backend. A value; thread-safe.
#pragma once

#include <cstddef>
#include <vector>

namespace lockstep {

// Element ranges of the n chunks: chunk c is [begin(c), end(c)).
class Chunks {
 public:
  // Splits `count` elements into n nearly equal chunks (the first ones get
  // the remainder).
  Chunks(std::size_t count, int n) : offsets_(static_cast<std::size_t>(n) + 1, 0) {
    const std::size_t base = count / static_cast<std::size_t>(n);
    const std::size_t extra = count % static_cast<std::size_t>(n);
    for (std::size_t c = 0; c < static_cast<std::size_t>(n); ++c)
      offsets_[c + 1] = offsets_[c] + base + (c < extra ? 1 : 0);
  }
  std::size_t begin(int c) const { return offsets_[static_cast<std::size_t>(c)]; }
  std::size_t end(int c) const { return offsets_[static_cast<std::size_t>(c) + 1]; }
  std::size_t size(int c) const { return end(c) - begin(c); }

 private:
  std::vector<std::size_t> offsets_;
};

}  // namespace lockstep
