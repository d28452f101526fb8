// The object collectives on bytes: objects of different sizes (empty ones
// included) arrive whole and in rank order, on tcp, shm and hier thread ranks.
#include <gtest/gtest.h>

#include "harness/thread_world.h"
#include "lockstep/object_collectives.h"

namespace lockstep {
namespace {

using testing::ThreadWorld;

class ObjectCollectivesTest : public ::testing::TestWithParam<std::string> {};

// Rank r's object: r * 1000 characters (rank 0's is empty), so sizes differ
// and cross the shm backend's inline and slot sizes.
std::string object_of(int r) { return std::string(static_cast<std::size_t>(r) * 1000, static_cast<char>('a' + r)); }

TEST_P(ObjectCollectivesTest, AllGatherObjectReturnsEveryRanksBytesInRankOrder) {
  ThreadWorld world(4, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    const auto all = all_gather_object(pg, to_bytes(object_of(rank)));
    ASSERT_EQ(all.size(), 4u);
    for (int q = 0; q < 4; ++q) EXPECT_EQ(to_string(all[static_cast<std::size_t>(q)]), object_of(q)) << "from rank " << q;
  });
}

TEST_P(ObjectCollectivesTest, GatherObjectFillsOnlyTheRoot) {
  ThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    const auto all = gather_object(pg, to_bytes(object_of(rank)), /*root=*/2);
    if (rank != 2) {
      EXPECT_TRUE(all.empty());
      return;
    }
    ASSERT_EQ(all.size(), 3u);
    for (int q = 0; q < 3; ++q) EXPECT_EQ(to_string(all[static_cast<std::size_t>(q)]), object_of(q));
  });
}

TEST_P(ObjectCollectivesTest, BroadcastObjectListReplacesEveryRanksList) {
  ThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<Bytes> objects;
    if (rank == 1) objects = {to_bytes("epoch 3"), to_bytes(""), to_bytes(std::string(100000, 'x'))};
    else objects = {to_bytes("stale")};
    broadcast_object_list(pg, objects, /*root=*/1);
    ASSERT_EQ(objects.size(), 3u);
    EXPECT_EQ(to_string(objects[0]), "epoch 3");
    EXPECT_TRUE(objects[1].empty());
    EXPECT_EQ(to_string(objects[2]), std::string(100000, 'x'));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, ObjectCollectivesTest, ::testing::Values("tcp", "shm", "hier2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
