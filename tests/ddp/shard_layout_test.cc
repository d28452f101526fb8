// ShardLayout: every element of every parameter lands in exactly one rank's
// shard, once, at the place the flat layout gives it; shards are equal and
// padded; the extra padding moves the cut points but loses nothing.
#include "ddp/shard_layout.h"

#include <gtest/gtest.h>

#include <vector>

#include "lockstep/error.h"

namespace lockstep {
namespace {

// Which rank and shard position holds each flat element, by walking every
// rank's pieces; checks that no element is held twice.
void expect_every_element_once(const ShardLayout& layout) {
  std::vector<int> holder(static_cast<std::size_t>(layout.data_elements()), -1);
  for (int rank = 0; rank < layout.world_size(); ++rank) {
    std::int64_t last_end = 0;
    for (const auto& piece : layout.pieces_of(rank)) {
      EXPECT_GE(piece.shard_offset, last_end) << "pieces out of order on rank " << rank;
      last_end = piece.shard_offset + piece.count;
      EXPECT_LE(last_end, layout.shard_elements());
      for (std::int64_t k = 0; k < piece.count; ++k) {
        const std::int64_t flat = layout.flat_offset(piece.param) + piece.param_offset + k;
        // The flat element sits where the rank's shard puts it.
        EXPECT_EQ(flat, rank * layout.shard_elements() + piece.shard_offset + k);
        auto& h = holder[static_cast<std::size_t>(flat)];
        EXPECT_EQ(h, -1) << "element " << flat << " held twice";
        h = rank;
      }
    }
  }
  for (std::size_t i = 0; i < holder.size(); ++i) EXPECT_NE(holder[i], -1) << "element " << i << " held by no rank";
}

TEST(ShardLayout, SplitsIntoEqualPaddedShards) {
  const ShardLayout layout({300, 20, 7}, 4);
  EXPECT_EQ(layout.data_elements(), 327);
  EXPECT_EQ(layout.shard_elements(), 82);
  EXPECT_EQ(layout.flat_elements(), 328);
  EXPECT_EQ(layout.flat_offset(2), 320);
  const auto rank1 = layout.pieces_of(1);
  ASSERT_EQ(rank1.size(), 1u);
  EXPECT_EQ(rank1[0].param, 0u);
  EXPECT_EQ(rank1[0].param_offset, 82);
  EXPECT_EQ(rank1[0].count, 82);
  const auto rank3 = layout.pieces_of(3);
  ASSERT_EQ(rank3.size(), 3u);
  EXPECT_EQ(rank3[0].count, 300 - 246);
  EXPECT_EQ(rank3[1].shard_offset, 54);
  EXPECT_EQ(rank3[2].count, 7);
  expect_every_element_once(layout);
}

TEST(ShardLayout, EveryElementOnceForManyShapesAndWorlds) {
  const std::vector<std::vector<std::int64_t>> models = {{1}, {5, 3}, {64, 64, 8}, {0, 9, 0, 2}, {13, 13, 13}};
  for (const auto& numels : models)
    for (int world = 1; world <= 7; ++world)
      for (std::int64_t extra : {0, 1, 5}) {
        SCOPED_TRACE(::testing::Message() << "world " << world << ", extra " << extra);
        const ShardLayout layout(numels, world, extra);
        EXPECT_EQ(layout.flat_elements() % world, 0);
        EXPECT_GE(layout.flat_elements(), layout.data_elements());
        expect_every_element_once(layout);
      }
}

TEST(ShardLayout, ARankPastTheDataHoldsNothing) {
  const ShardLayout layout({3}, 4, 0);  // shards of 1: rank 3 holds padding only
  EXPECT_TRUE(layout.pieces_of(3).empty());
  EXPECT_EQ(layout.piece_of(3, 0).count, 0);
}

TEST(ShardLayout, RefusesWhatCannotBeLaidOut) {
  EXPECT_THROW(ShardLayout({4}, 0), InvalidArgument);
  EXPECT_THROW(ShardLayout({-1}, 2), InvalidArgument);
  EXPECT_THROW(ShardLayout({4}, 2, -1), InvalidArgument);
  EXPECT_THROW(ShardLayout({4}, 2).pieces_of(2), InvalidArgument);
}

}  // namespace
}  // namespace lockstep
