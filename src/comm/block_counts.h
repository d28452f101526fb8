// The block sizes of an all_to_all with per-rank counts, as every rank of
// the group knows them once the front end has agreed on them: how many
// elements each rank sends to each other rank. Backends read this rank's
// row (what it sends) and column (what it receives) with their offsets.
// A value; thread-safe to read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep {

class BlockCounts {
 public:
  // Every block holds `block` elements.
  static BlockCounts uniform(int n, int self, std::size_t block) {
    return BlockCounts(n, self, std::vector<std::size_t>(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), block));
  }
  // matrix[r * n + q]: elements rank r sends to rank q.
  BlockCounts(int n, int self, std::vector<std::size_t> matrix) : n_(n), self_(self), matrix_(std::move(matrix)) {
    send_offsets_.assign(static_cast<std::size_t>(n) + 1, 0);
    recv_offsets_.assign(static_cast<std::size_t>(n) + 1, 0);
    for (int q = 0; q < n; ++q) {
      send_offsets_[static_cast<std::size_t>(q) + 1] = send_offsets_[static_cast<std::size_t>(q)] + at(self, q);
      recv_offsets_[static_cast<std::size_t>(q) + 1] = recv_offsets_[static_cast<std::size_t>(q)] + at(q, self);
    }
    for (std::size_t c : matrix_) max_block_ = c > max_block_ ? c : max_block_;
  }

  int size() const { return n_; }
  std::size_t at(int from, int to) const {
    return matrix_[static_cast<std::size_t>(from) * static_cast<std::size_t>(n_) + static_cast<std::size_t>(to)];
  }
  // This rank's blocks: what it sends to q (from its input) and receives
  // from q (into its output), in elements.
  std::size_t send_count(int q) const { return at(self_, q); }
  std::size_t send_offset(int q) const { return send_offsets_[static_cast<std::size_t>(q)]; }
  std::size_t recv_count(int q) const { return at(q, self_); }
  std::size_t recv_offset(int q) const { return recv_offsets_[static_cast<std::size_t>(q)]; }
  // Where rank `from`'s block for rank `to` starts in `from`'s input.
  std::size_t offset(int from, int to) const {
    std::size_t at = 0;
    for (int p = 0; p < to; ++p) at += this->at(from, p);
    return at;
  }
  std::size_t send_total() const { return send_offsets_.back(); }
  std::size_t recv_total() const { return recv_offsets_.back(); }
  // The largest block of any pair: the same on every rank, so algorithms
  // that go in rounds agree on how many.
  std::size_t max_block() const { return max_block_; }
  const std::vector<std::size_t>& matrix() const { return matrix_; }

 private:
  int n_;
  int self_;
  std::vector<std::size_t> matrix_;
  std::vector<std::size_t> send_offsets_;
  std::vector<std::size_t> recv_offsets_;
  std::size_t max_block_ = 0;
};

// FNV-1a over the counts: the digest the collective check compares
// (OpInfo::counts_digest). Never 0, so it always says "per-rank counts".
inline std::uint64_t counts_digest(const std::vector<std::size_t>& counts) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t c : counts) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((static_cast<std::uint64_t>(c) >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace lockstep
