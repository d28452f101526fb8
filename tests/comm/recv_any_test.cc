// ProcessGroup::recv_any on thread ranks, on every backend that moves host
// memory itself (tcp, shm, hier on one and on two pretend hosts): several
// senders to one receiver, with each message's content, reported source and
// sender's order checked; receives from any source mixed with named ones and
// with collectives; and the errors: a mismatched message names its sender,
// a wait nobody answers times out saying so, a group of one refuses.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "harness/thread_world.h"
#include "recv_any_cases.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::ThreadWorld;

class RecvAnyTest : public ::testing::TestWithParam<std::string> {};

// Small messages, and ones of several shm mailbox chunks (64 KiB) and more
// than a socket buffer holds at once.
TEST_P(RecvAnyTest, EverySendersMessagesArriveWholeOnceAndInOrderWithTheirSource) {
  for (int n : {3, 4}) {
    ThreadWorld world(n, GetParam());
    for (std::size_t count : {std::size_t{16}, std::size_t{40'000}}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + std::to_string(count) + " elements");
      world.run([&](int rank, ProcessGroup& pg) {
        if (rank == 0) testing::receive_from_every_sender(pg, /*messages=*/6, count);
        else testing::send_numbered_messages(pg, 0, /*messages=*/6, count);
      });
    }
  }
}

// A named recv and recv_any take their messages from the same stream of
// each sender: rank 0 first takes rank 1's first message by name, then
// everything else from any source, in each sender's order.
TEST_P(RecvAnyTest, NamedAndAnySourceReceivesKeepEachSendersOrder) {
  ThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    constexpr int kMessages = 4;
    constexpr std::size_t kCount = 100;
    if (rank != 0) return testing::send_numbered_messages(pg, 0, kMessages, kCount);
    std::vector<std::int64_t> got(kCount);
    auto named = pg.recv(Buffer{got.data(), kCount, DType::i64}, 1);
    named->wait();
    EXPECT_EQ(named->source_rank(), 1);
    ASSERT_EQ(testing::check_message(got, 1, 0), "");
    std::vector<int> next = {0, 1, 0};
    for (int k = 0; k < 2 * kMessages - 1; ++k) {
      auto work = pg.recv_any(Buffer{got.data(), kCount, DType::i64});
      work->wait();
      const int source = work->source_rank();
      ASSERT_TRUE(source == 1 || source == 2) << source;
      ASSERT_EQ(testing::check_message(got, source, next[static_cast<std::size_t>(source)]++), "") << "receive " << k;
    }
  });
}

// Rank 2 sends, then goes on to a gather whose first bytes (its stamp, on
// the tcp mesh: rooted collectives check their root around the ring, 2 ->
// 0) reach rank 0 while rank 0 still waits for rank 1's later message: a
// receive from any source must take rank 1's message, not rank 2's gather.
TEST_P(RecvAnyTest, ASenderThatWentOnToACollectiveIsNotTakenForAMessage) {
  ThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    constexpr std::size_t kCount = 10;
    if (rank == 0) {
      std::vector<int> sources;
      for (int k = 0; k < 2; ++k) {
        std::vector<std::int64_t> got(kCount);
        auto work = pg.recv_any(Buffer{got.data(), kCount, DType::i64});
        work->wait();
        sources.push_back(work->source_rank());
        ASSERT_EQ(testing::check_message(got, sources.back(), 0), "");
      }
      EXPECT_EQ(sources, (std::vector<int>{2, 1}));
    } else {
      if (rank == 1) std::this_thread::sleep_for(300ms);  // rank 2 is in the gather by then
      testing::send_numbered_messages(pg, 0, 1, kCount);
    }
    const float mine = static_cast<float>(rank + 1);
    std::vector<float> all(3, 0.0f);
    pg.gather(ConstBuffer{&mine, 1, DType::f32}, rank == 0 ? view(std::span(all)) : Buffer{}, 0)->wait();
    if (rank == 0) EXPECT_EQ(all, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  });
}

TEST_P(RecvAnyTest, AMismatchedMessageIsAMismatchErrorNamingItsSender) {
  ThreadWorld world(3, GetParam(), 10s);
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> buf(20);
    if (rank == 2) pg.send(ConstBuffer{buf.data(), 10, DType::f32}, 0, /*tag=*/3)->wait();
    if (rank == 0) pg.recv_any(view(std::span(buf)), /*tag=*/3)->wait();
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const MismatchError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0/3"), std::string::npos) << what;
    EXPECT_NE(what.find("from any rank"), std::string::npos) << what;
    EXPECT_NE(what.find("from rank 2 expected tag 3, 20 x float (80 bytes)"), std::string::npos) << what;
    EXPECT_NE(what.find("but rank 2 sent tag 3, 40 bytes of float"), std::string::npos) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a MismatchError: " << e.what();
  }
}

TEST_P(RecvAnyTest, AReceiveNoRankAnswersTimesOutSayingWhomItWaitedFor) {
  ThreadWorld world(3, GetParam(), 2s);
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> buf(5);
    if (rank == 0) pg.recv_any(view(std::span(buf)))->wait();
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("recv #0 (float x 5 from any rank, tag 0) timed out"), std::string::npos) << what;
    EXPECT_NE(what.find("from any of ranks 1, 2"), std::string::npos) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a TimeoutError: " << e.what();
  }
}

// Ranks 1 and 2 skip their sends and go on to an all_to_all, which writes
// its stamps to every peer at once. tcp and hier (whose point to point is
// the flat tcp mesh) see both stamps at the head of rank 0's connections:
// nobody can send, a MismatchError at once. shm keeps point to point apart
// from collectives, so rank 0 waits until its deadline.
TEST_P(RecvAnyTest, WhenEveryPeerWentOnToACollectiveNoSenderIsLeft) {
  ThreadWorld world(3, GetParam(), 3s);
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> buf(3, 1.0f), out(3);
    if (rank == 0) pg.recv_any(Buffer{buf.data(), 1, DType::f32})->wait();
    pg.all_to_all(const_view(std::span<const float>(buf)), view(std::span(out)))->wait();
  });
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const MismatchError& e) {
    EXPECT_NE(GetParam(), "shm") << e.what();
    EXPECT_NE(std::string(e.what()).find("rank(s) 1, 2 went on to a collective"), std::string::npos) << e.what();
  } catch (const TimeoutError& e) {
    EXPECT_EQ(GetParam(), "shm") << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "neither a MismatchError nor a TimeoutError: " << e.what();
  }
}

// source_rank() of the other operations: a named recv reports its source,
// everything else -1.
TEST_P(RecvAnyTest, SourceRankOfANamedRecvIsItsSourceAndOfOtherOperationsNone) {
  ThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<float> buf(4, 1.0f);
    auto p2p = rank == 0 ? pg.send(view(std::span(buf)), 1) : pg.recv(view(std::span(buf)), 0);
    p2p->wait();
    EXPECT_EQ(p2p->source_rank(), rank == 0 ? -1 : 0);
    auto sum = pg.allreduce(view(std::span(buf)));
    sum->wait();
    EXPECT_EQ(sum->source_rank(), -1);
  });
}

TEST_P(RecvAnyTest, AGroupOfOneRefusesForItHasNoOtherRank) {
  ThreadWorld world(1, GetParam());
  std::vector<float> buf(4);
  try {
    world.group(0).recv_any(view(std::span(buf)));
    ADD_FAILURE() << "recv_any in a group of one was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no other rank"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, RecvAnyTest, ::testing::Values("tcp", "shm", "hier1", "hier2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
