// DistributedSampler: disjoint shards that cover the dataset, padding and
// drop_last as in PyTorch, determinism per epoch, the exact mode, and
// resuming an epoch on another world size.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "lockstep/error.h"
#include "lockstep/sampler.h"

namespace lockstep {
namespace {

std::vector<std::vector<std::size_t>> shards(SamplerOptions o, std::uint64_t epoch = 0) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < o.num_replicas; ++r) {
    o.rank = r;
    DistributedSampler s(o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    EXPECT_EQ(out.back().size(), s.num_samples());
  }
  return out;
}

TEST(DistributedSampler, ShardsAreDisjointAndCoverTheDatasetWhenItDivides) {
  for (int ranks : {1, 2, 3, 4, 8}) {
    const auto parts = shards({.dataset_size = 96, .num_replicas = ranks, .seed = 5});
    std::multiset<std::size_t> seen;
    for (const auto& p : parts) seen.insert(p.begin(), p.end());
    EXPECT_EQ(seen.size(), 96u);
    EXPECT_EQ(std::set<std::size_t>(seen.begin(), seen.end()).size(), 96u) << ranks << " ranks";
  }
}

TEST(DistributedSampler, PadsByRepeatingFromTheStartLikePyTorch) {
  const auto parts = shards({.dataset_size = 10, .num_replicas = 4, .shuffle = false});
  // 10 samples, 4 ranks: 3 each, total 12; indices 0..9 then 0, 1.
  EXPECT_EQ(parts[0], (std::vector<std::size_t>{0, 4, 8}));
  EXPECT_EQ(parts[1], (std::vector<std::size_t>{1, 5, 9}));
  EXPECT_EQ(parts[2], (std::vector<std::size_t>{2, 6, 0}));
  EXPECT_EQ(parts[3], (std::vector<std::size_t>{3, 7, 1}));
  // Padding larger than the dataset repeats it more than once.
  const auto tiny = shards({.dataset_size = 2, .num_replicas = 5, .shuffle = false});
  EXPECT_EQ(tiny[4], (std::vector<std::size_t>{0}));
}

TEST(DistributedSampler, DropLastDropsTheUnevenTail) {
  const auto parts = shards({.dataset_size = 10, .num_replicas = 4, .shuffle = false, .drop_last = true});
  for (const auto& p : parts) EXPECT_EQ(p.size(), 2u);
  EXPECT_EQ(parts[3], (std::vector<std::size_t>{3, 7}));
}

TEST(DistributedSampler, ExactModeCountsEverySampleOnce) {
  for (int ranks : {1, 2, 3, 7}) {
    const auto parts = shards({.dataset_size = 10001, .num_replicas = ranks, .seed = 3, .exact = true});
    std::vector<std::size_t> all;
    for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), 10001u) << ranks << " ranks";
    for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i);
    const auto [smallest, largest] = std::minmax_element(parts.begin(), parts.end(),
                                                         [](const auto& a, const auto& b) { return a.size() < b.size(); });
    EXPECT_LE(largest->size() - smallest->size(), 1u);
  }
}

TEST(DistributedSampler, TheSameEpochGivesTheSameOrderAndEpochsDiffer) {
  SamplerOptions o{.dataset_size = 1000, .num_replicas = 2, .rank = 1, .seed = 42};
  DistributedSampler a(o), b(o);
  a.set_epoch(3);
  b.set_epoch(3);
  EXPECT_EQ(a.indices(), b.indices());
  b.set_epoch(4);
  EXPECT_NE(a.indices(), b.indices());
  o.seed = 43;
  DistributedSampler c(o);
  c.set_epoch(3);
  EXPECT_NE(a.indices(), c.indices());
}

TEST(DistributedSampler, ShuffleIsAUniformPermutation) {
  // Each index lands in each position about equally often.
  std::map<std::pair<std::size_t, std::size_t>, int> counts;
  constexpr int kTrials = 20000;
  for (int t = 0; t < kTrials; ++t) {
    const auto p = shuffled_indices(4, static_cast<std::uint64_t>(t));
    for (std::size_t pos = 0; pos < 4; ++pos) counts[{pos, p[pos]}]++;
  }
  for (const auto& [key, count] : counts) EXPECT_NEAR(count, kTrials / 4, kTrials / 40) << key.first << "," << key.second;
}

TEST(DistributedSampler, RejectsImpossibleOptions) {
  EXPECT_THROW(DistributedSampler({.dataset_size = 10, .num_replicas = 2, .rank = 2}), InvalidArgument);
  EXPECT_THROW(DistributedSampler({.dataset_size = 10, .num_replicas = 2, .drop_last = true, .exact = true}),
               InvalidArgument);
}

// An elastic job trains `steps` steps of `batch` samples per rank on
// `before` ranks, then resumes the epoch on `after` ranks from that point.
// Counts how often each sample of the epoch is trained on.
std::map<std::size_t, int> epoch_across_a_world_change(SamplerOptions o, int before, int after, std::size_t batch,
                                                       std::size_t steps) {
  std::map<std::size_t, int> seen;
  o.num_replicas = before;
  for (const auto& shard : shards(o, /*epoch=*/3))
    for (std::size_t i = 0; i < std::min(shard.size(), steps * batch); ++i) seen[shard[i]]++;
  o.num_replicas = after;
  o.resume_at = steps * batch * static_cast<std::size_t>(before);
  for (const auto& shard : shards(o, /*epoch=*/3))
    for (std::size_t index : shard) seen[index]++;
  return seen;
}

TEST(DistributedSampler, ReshardingForANewWorldSizeNeitherSkipsNorRepeatsASample) {
  for (const std::size_t n : {1000u, 1001u, 60000u})
    for (const auto& [before, after] : {std::pair{3, 2}, std::pair{2, 3}, std::pair{4, 1}, std::pair{1, 5}})
      for (const std::size_t steps : {0u, 1u, 7u}) {
        const auto seen = epoch_across_a_world_change({.dataset_size = n, .seed = 11, .exact = true}, before, after,
                                                      /*batch=*/16, steps);
        ASSERT_EQ(seen.size(), n) << n << " samples, " << before << " -> " << after << " ranks after " << steps;
        for (const auto& [index, count] : seen)
          ASSERT_EQ(count, 1) << "sample " << index << ", " << before << " -> " << after << " ranks after " << steps;
      }
}

TEST(DistributedSampler, ReshardingWithPaddingRepeatsOnlyThePadding) {
  const std::size_t n = 1001, batch = 10, steps = 5;
  SamplerOptions o{.dataset_size = n, .seed = 2};
  const auto seen = epoch_across_a_world_change(o, 3, 4, batch, steps);
  ASSERT_EQ(seen.size(), n) << "a sample was skipped";
  int repeats = 0;
  for (const auto& [index, count] : seen) repeats += count - 1;
  // The rest (1001 - 150 = 851) padded to a multiple of 4: 852, one repeat.
  EXPECT_EQ(repeats, 1);
  o.num_replicas = 4;
  o.resume_at = steps * batch * 3;
  EXPECT_EQ(DistributedSampler(o).total_size(), 852u);
  EXPECT_EQ(DistributedSampler(o).num_samples(), 213u);
}

TEST(DistributedSampler, ResumingPastTheEndLeavesNothing) {
  DistributedSampler s({.dataset_size = 10, .num_replicas = 2, .resume_at = 12});
  EXPECT_EQ(s.num_samples(), 0u);
  EXPECT_TRUE(s.indices().empty());
}

}  // namespace
}  // namespace lockstep
