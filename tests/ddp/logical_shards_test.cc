// Which rank holds which logical shard (src/ddp/logical_shards.h): a clean
// job holds each shard at home; after a loss a shard stays home while its
// rank is there, and the others' are dealt in turn, lowest world rank first.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/logical_shards.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

TEST(LogicalShards, AFullJobHoldsEachShardAtHome) {
  EXPECT_EQ(assign_shards(4, 4, {0, 1, 2, 3}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(assign_shards(8, 4, {0, 1, 2, 3}), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
}

TEST(LogicalShards, ALostRanksShardsGoToTheSurvivorsInTurn) {
  // World rank 2 lost: members are world ranks 0, 1, 3 (indices 0, 1, 2).
  EXPECT_EQ(assign_shards(4, 4, {0, 1, 3}), (std::vector<int>{0, 1, 0, 2}));
  // Ranks 0 and 3 lost: shards 0 and 3 go to world ranks 1 and 2.
  EXPECT_EQ(assign_shards(4, 4, {1, 2}), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(shards_held(assign_shards(4, 4, {1, 2}), 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(shards_held(assign_shards(4, 4, {1, 2}), 1), (std::vector<int>{2, 3}));
  // One left: it holds everything.
  EXPECT_EQ(assign_shards(4, 4, {2}), (std::vector<int>{0, 0, 0, 0}));
}

TEST(LogicalShards, EveryRankComputesTheSameMapFromTheMembersAlone) {
  const std::vector<int> members = {0, 2, 3, 5, 6};
  const std::vector<int> holder = assign_shards(8, 8, members);
  ASSERT_EQ(holder.size(), 8u);
  std::vector<int> count(members.size(), 0);
  for (int h : holder) ++count[static_cast<std::size_t>(h)];
  for (int c : count) EXPECT_GE(c, 1);
  for (int c : count) EXPECT_LE(c, 2) << "8 shards over 5 members: at most 2 each";
  EXPECT_EQ(holder, assign_shards(8, 8, members));
}

TEST(LogicalShards, NoShardsOrNoMembersIsRefused) {
  EXPECT_THROW(assign_shards(0, 4, {0}), InvalidArgument);
  EXPECT_THROW(assign_shards(4, 4, {}), InvalidArgument);
}

}  // namespace
}  // namespace lockstep
