// The copy into the shm slots (handoff_copy.h) and the measure that turns
// its streaming stores on (peer_distance.h): bytes equal for every
// alignment and size around the thresholds; far only on a window of slow
// samples, and back when they turn fast; messages through the mailboxes
// with streaming stores always on. (The collectives with them on are in
// collectives_sweep_test, as shm_streaming and shm_slots_streaming.)
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "comm/shm/handoff_copy.h"
#include "comm/shm/peer_distance.h"
#include "harness/thread_world.h"

namespace lockstep::shm {
namespace {

std::vector<unsigned char> pattern(std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 131 + 7);
  return v;
}

TEST(HandoffCopy, EqualsTheSourceForEveryAlignmentAndSize) {
  const std::size_t sizes[] = {0, 1, 15, 63, 64, 65, 127, 4095, 65535, 65536, 65536 + 13, 1048576 + 7};
  for (std::size_t bytes : sizes) {
    for (std::size_t streaming_from : {std::size_t{0}, std::size_t{1}, std::size_t{65536}}) {
      for (std::size_t dst_shift : {0, 1, 8, 15, 16, 33}) {
        for (std::size_t src_shift : {0, 3, 16}) {
          const auto src = pattern(bytes + src_shift);
          // Guard bytes around the destination catch a write past either end.
          std::vector<unsigned char> dst(bytes + dst_shift + 64, 0xAB);
          copy_for_peer(dst.data() + dst_shift, src.data() + src_shift, bytes, streaming_from);
          for (std::size_t i = 0; i < dst_shift; ++i) ASSERT_EQ(dst[i], 0xAB) << "before, byte " << i;
          for (std::size_t i = 0; i < bytes; ++i)
            ASSERT_EQ(dst[dst_shift + i], src[src_shift + i])
                << bytes << " bytes, streaming from " << streaming_from << ", dst +" << dst_shift << ", src +"
                << src_shift << ": byte " << i;
          for (std::size_t i = dst_shift + bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << "after, byte " << i;
        }
      }
    }
  }
}

TEST(PeerDistance, NearUntilAWindowOfSamplesIsIn) {
  PeerDistance d;
  for (std::size_t i = 0; i + 1 < PeerDistance::kWindow; ++i) {
    EXPECT_FALSE(d.record(1000));
    EXPECT_FALSE(d.far());
  }
  EXPECT_TRUE(d.record(1000));  // the window's last sample decides, and reports the change
  EXPECT_TRUE(d.far());
  EXPECT_FALSE(d.record(1000));
}

TEST(PeerDistance, FollowsTheMedianBothWays) {
  PeerDistance d;
  for (std::size_t i = 0; i < PeerDistance::kWindow; ++i) d.record(100);  // the far placement measured
  EXPECT_TRUE(d.far());
  // A few near samples do not move the median; a window's majority does.
  for (std::size_t i = 0; i < PeerDistance::kWindow / 2 - 1; ++i) d.record(15);
  EXPECT_TRUE(d.far());
  int changes = 0;
  for (std::size_t i = 0; i < PeerDistance::kWindow; ++i) changes += d.record(15) ? 1 : 0;
  EXPECT_FALSE(d.far());
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(d.median(), 15);
  // At the threshold itself: near (only slower counts as far).
  for (std::size_t i = 0; i < PeerDistance::kWindow; ++i) d.record(PeerDistance::kFarNanos);
  EXPECT_FALSE(d.far());
}

TEST(PeerDistance, NegativeSamplesCountAsNear) {
  // The clock's cost is taken off each sample and may exceed a fast load.
  PeerDistance d;
  for (std::size_t i = 0; i < PeerDistance::kWindow; ++i) d.record(-5);
  EXPECT_FALSE(d.far());
}

// Messages of sizes around the mailbox (64 KiB) and the streaming threshold,
// both ways, every byte checked.
TEST(StreamingStores, CarryEveryMessageThroughTheMailboxes) {
  ::setenv("LOCKSTEP_SHM_STREAMING_STORES", "always", 1);
  testing::ThreadWorld world(2, "shm");
  ::unsetenv("LOCKSTEP_SHM_STREAMING_STORES");
  world.run([](int rank, ProcessGroup& pg) {
    const int peer = 1 - rank;
    for (std::size_t bytes : {std::size_t{1}, std::size_t{65535}, std::size_t{65536}, std::size_t{200003},
                              std::size_t{1048581}}) {
      std::vector<unsigned char> out(bytes), in(bytes, 0);
      for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 31 + rank);
      // Rank 0 sends first, rank 1 receives first: a send may wait for room.
      const auto send = [&] { pg.send(ConstBuffer{out.data(), bytes, DType::u8}, peer, 3)->wait(); };
      const auto recv = [&] { pg.recv(Buffer{in.data(), bytes, DType::u8}, peer, 3)->wait(); };
      if (rank == 0) {
        send();
        recv();
      } else {
        recv();
        send();
      }
      for (std::size_t i = 0; i < bytes; ++i)
        ASSERT_EQ(in[i], static_cast<unsigned char>(i * 31 + peer)) << bytes << " bytes, byte " << i;
    }
  });
}

}  // namespace
}  // namespace lockstep::shm
