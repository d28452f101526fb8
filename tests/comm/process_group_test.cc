// ProcessGroup behaviour on thread ranks: asynchrony and order, argument
// checks, point to point, barrier, sub-groups, bitwise identity, and the
// errors a user sees when ranks disagree or stall.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <latch>
#include <random>
#include <thread>

#include "common/clock.h"
#include "harness/bare_config.h"
#include "harness/manual_clock.h"
#include "harness/thread_world.h"
#include "reference.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::ThreadWorld;

// Every behaviour holds on every backend.
class ProcessGroupTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessGroupTest, WorkCompletesAsynchronouslyAndInIssueOrder) {
  ThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<std::vector<float>> bufs(10, std::vector<float>(5000, static_cast<float>(rank + 1)));
    std::vector<std::shared_ptr<Work>> works;
    std::vector<std::uint64_t> completion_order;
    std::mutex m;
    for (auto& b : bufs) {
      works.push_back(pg.allreduce(view(std::span(b))));
      works.back()->on_complete([&](const Work& w) {
        std::lock_guard lock(m);
        completion_order.push_back(w.seq());
      });
    }
    for (auto& w : works) w->wait();
    for (auto& b : bufs) ASSERT_EQ(b[0], 6.0f);
    ASSERT_EQ(completion_order.size(), 10u);
    for (std::size_t i = 1; i < completion_order.size(); ++i) ASSERT_LT(completion_order[i - 1], completion_order[i]);
    ASSERT_TRUE(works.back()->done());
    ASSERT_FALSE(works.back()->error());
    ASSERT_GE(works.back()->finished_us(), works.back()->started_us());
  });
}

// Large operations always run on the progress thread, so issuing one returns
// at once even when a peer is late (small ones may run inline; see below).
// Rank 1 issues its allreduce only after rank 0's issue has returned: were
// the issue to wait for the collective, rank 0 would never return and rank
// 1 would give up waiting for it.
TEST_P(ProcessGroupTest, IssueReturnsBeforeTheCollectiveFinishes) {
  ThreadWorld world(2, GetParam());
  std::promise<void> rank0_issued;
  std::shared_future<void> issued = rank0_issued.get_future().share();
  world.run([&](int rank, ProcessGroup& pg) {
    std::vector<float> data(1 << 20, 1.0f);
    if (rank == 1) ASSERT_EQ(issued.wait_for(60s), std::future_status::ready) << "rank 0's issue never returned";
    auto work = pg.allreduce(view(std::span(data)));
    if (rank == 0) {
      EXPECT_FALSE(work->done()) << "finished without rank 1, which has not issued yet";
      rank0_issued.set_value();
    }
    work->wait();
    EXPECT_EQ(data[0], 2.0f);
  });
}

TEST_P(ProcessGroupTest, ResultsAreBitwiseIdenticalOnEveryRank) {
  for (int n : {3, 4, 5}) {
    ThreadWorld world(n, GetParam());
    for (std::size_t count : {100u, 300000u}) {  // both algorithms
      std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
      std::vector<std::vector<std::uint16_t>> halves(static_cast<std::size_t>(n));
      world.run([&](int rank, ProcessGroup& pg) {
        std::mt19937 rng(static_cast<unsigned>(rank * 7919 + 1));
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        auto& f = results[static_cast<std::size_t>(rank)];
        auto& h = halves[static_cast<std::size_t>(rank)];
        f.resize(count);
        h.resize(count);
        for (std::size_t i = 0; i < count; ++i) {
          f[i] = dist(rng) * 1e3f;  // sums of these round: order matters
          h[i] = float_to_bf16(dist(rng));
        }
        pg.allreduce(view(std::span(f)))->wait();
        pg.allreduce(Buffer{h.data(), count, DType::bf16}, ReduceOp::avg)->wait();
      });
      for (int r = 1; r < n; ++r) {
        EXPECT_EQ(0, std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(), count * 4))
            << n << " ranks, rank " << r << " differs, count " << count;
        EXPECT_EQ(halves[0], halves[static_cast<std::size_t>(r)]) << n << " ranks, bf16, rank " << r;
      }
    }
  }
}

TEST_P(ProcessGroupTest, SendAndRecvPassDataAndTags) {
  ThreadWorld world(3, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    // A ring of sends: each rank sends to the next and receives from the previous.
    std::vector<std::int64_t> out(1000, rank), in(1000, -1);
    const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
    if (rank % 2 == 0) {
      pg.send(const_view(std::span<const std::int64_t>(out)), next, 7)->wait();
      pg.recv(view(std::span(in)), prev, 7)->wait();
    } else {
      pg.recv(view(std::span(in)), prev, 7)->wait();
      pg.send(const_view(std::span<const std::int64_t>(out)), next, 7)->wait();
    }
    ASSERT_EQ(in[0], prev);
    ASSERT_EQ(in[999], prev);
  });
}

TEST_P(ProcessGroupTest, MismatchedSendAndRecvIsAMismatchError) {
  ThreadWorld world(2, GetParam(), 10s);
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> buf(10);
    if (rank == 0) pg.send(const_view(std::span<const float>(buf)), 1, /*tag=*/1)->wait();
    else pg.recv(view(std::span(buf)), 0, /*tag=*/2)->wait();
  });
  ASSERT_TRUE(errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("expected tag 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sent tag 1"), std::string::npos) << e.what();
  }
}

// Messages far larger than shm's two mailbox slots and a socket's buffer:
// a ring of two messages each, with their tags, arrive whole and in order.
// A large message received with the wrong size is a MismatchError, and its
// sender does not wait forever.
void ring_of_large_messages(ProcessGroup& pg) {
  constexpr std::size_t kCount = 700'000;  // 5.6 MB of int64
  const int size = pg.size(), rank = pg.rank();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  std::vector<std::int64_t> out(kCount), in(kCount, -1);
  for (int message = 0; message < 2; ++message) {
    for (std::size_t i = 0; i < kCount; ++i) out[i] = rank * 1'000'000'000LL + message * 10'000'000LL + static_cast<std::int64_t>(i);
    const auto send = [&] { pg.send(const_view(std::span<const std::int64_t>(out)), next, 20 + message)->wait(); };
    const auto receive = [&] { pg.recv(view(std::span(in)), prev, 20 + message)->wait(); };
    if (rank % 2 == 0) {
      send();
      receive();
    } else {
      receive();
      send();
    }
    for (std::size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(in[i], prev * 1'000'000'000LL + message * 10'000'000LL + static_cast<std::int64_t>(i)) << "element " << i;
  }
}

TEST_P(ProcessGroupTest, LargeMessagesArriveWholeAndInOrder) {
  ThreadWorld world(3, GetParam());
  world.run([](int, ProcessGroup& pg) { ring_of_large_messages(pg); });
}

TEST_P(ProcessGroupTest, ALargeMessageOfAnotherSizeIsAMismatchError) {
  ThreadWorld world(2, GetParam(), 10s);
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> buf(rank == 0 ? 500'000 : 400'000);
    if (rank == 0) pg.send(const_view(std::span<const float>(buf)), 1, 3)->wait();
    else pg.recv(view(std::span(buf)), 0, 3)->wait();
  });
  ASSERT_TRUE(errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("2000000"), std::string::npos) << e.what();
  }
}

// Collectives that differ across ranks are refused by the shm and tcp
// backends always (not only with LOCKSTEP_DEBUG=DETAIL): rank 1 skips iteration 3's
// all-reduce, so its next one (one element longer) meets the others' and
// every rank fails there, naming both operations, instead of reducing
// unrelated data for the rest of the loop. At each size class: inline,
// one-shot and pipelined two-shot. (Operations are numbered from 0.)
TEST_P(ProcessGroupTest, ARankThatSkipsAnAllreduceIsAMismatchOnEveryRankAtOnce) {
  for (const std::size_t base : {std::size_t{3}, std::size_t{1000}, std::size_t{300000}}) {
    SCOPED_TRACE("count " + std::to_string(base));
    ThreadWorld world(3, GetParam(), 3s);
    std::vector<int> completed(3, 0);
    auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
      for (int i = 0; i < 8; ++i) {
        if (rank == 1 && i == 3) continue;
        std::vector<float> data(base + static_cast<std::size_t>(i), static_cast<float>(rank + 1));
        pg.allreduce(view(std::span(data)))->wait();
        ASSERT_EQ(data.front(), 6.0f) << "iteration " << i;
        ASSERT_EQ(data.back(), 6.0f) << "iteration " << i;
        ++completed[static_cast<std::size_t>(rank)];
      }
    });
    // shm: every rank reads every other's stamp, so every rank names the
    // mismatch. tcp: a rank that receives a stamp from rank 1 at that step
    // does, and the others are aborted with its report (the group's first
    // failure) instead of timing out waiting for data that does not come:
    // a TimeoutError here would mean they waited out the 3 s timeout.
    // Nobody computes a wrong result.
    int mismatches = 0;
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_EQ(completed[static_cast<std::size_t>(r)], 3);
      ASSERT_TRUE(errors[static_cast<std::size_t>(r)]);
      try {
        std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
      } catch (const MismatchError& e) {
        ++mismatches;
        const std::string what = e.what();
        const std::string ours = "float x " + std::to_string(base + (r == 1 ? 4 : 3));
        const std::string theirs = "float x " + std::to_string(base + (r == 1 ? 3 : 4));
        EXPECT_NE(what.find("allreduce #3 (" + ours), std::string::npos) << what;
        EXPECT_NE(what.find(theirs), std::string::npos) << what;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not a MismatchError: " << e.what();
      }
    }
    EXPECT_EQ(mismatches, 3);
  }
}

// ProcessGroup::abort ends every rank's group with the program's reason:
// the rank waiting in an all-reduce is released long before its timeout.
TEST_P(ProcessGroupTest, AbortEndsEveryRanksGroupWithTheReason) {
  ThreadWorld world(2, GetParam(), 60s);
  const auto start = Clock::now();
  auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    std::vector<float> data(100000, 1.0f);
    if (rank == 0) {
      pg.abort("the data loader failed");
      EXPECT_TRUE(pg.aborted());
      pg.allreduce(view(std::span(data)))->wait();  // refused at once
    } else {
      pg.allreduce(view(std::span(data)))->wait();  // cancelled
    }
  });
  EXPECT_LT(seconds_between(start, Clock::now()), 30.0) << "a rank waited for the 60 s timeout";
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0/2: the program aborted the group: the data loader failed"),
                std::string::npos)
          << "rank " << r << ": " << e.what();
    }
  }
}

// The test harness relies on it: a rank whose body throws aborts the group,
// so the others fail at once instead of waiting out the timeout.
TEST_P(ProcessGroupTest, ARankWhoseTestBodyThrowsReleasesTheOthers) {
  ThreadWorld world(3, GetParam(), 60s);
  const auto start = Clock::now();
  auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    if (rank == 1) throw std::runtime_error("an assertion of rank 1");
    std::vector<float> data(1000, 1.0f);
    pg.allreduce(view(std::span(data)))->wait();
  });
  EXPECT_LT(seconds_between(start, Clock::now()), 30.0) << "a rank waited for the 60 s timeout";
  for (int r : {0, 2}) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1's test body threw: an assertion of rank 1"), std::string::npos)
          << e.what();
    }
  }
}

TEST_P(ProcessGroupTest, DifferentCollectivesOrRootsAtTheSamePointAreRefused) {
  ThreadWorld world(2, GetParam(), 3s);
  auto errors = world.run_collecting([&](int rank, ProcessGroup& pg) {
    std::vector<float> data(5000, 1.0f);
    if (rank == 0) pg.broadcast(view(std::span(data)), 0)->wait();
    else pg.allreduce(view(std::span(data)))->wait();
  });
  // The broadcast's root only hands its data out, which stays right; the
  // rank that expected an all-reduce must not use it.
  ASSERT_TRUE(errors[1]);
  try {
    std::rethrow_exception(errors[1]);
  } catch (const MismatchError& m) {
    EXPECT_NE(std::string(m.what()).find("broadcast #0 (float x 5000, root 0)"), std::string::npos) << m.what();
  } catch (const std::exception& other) {
    ADD_FAILURE() << "not a MismatchError: " << other.what();
  }
  auto rooted = ThreadWorld(2, GetParam(), 3s).run_collecting([&](int rank, ProcessGroup& pg) {
    std::vector<float> data(5000, 1.0f);
    pg.reduce(view(std::span(data)), /*root=*/rank)->wait();
  });
  // Each root would wait to receive from a rank that only sends: both
  // backends check the roots first (shm: each rank reads the others'
  // stamps; tcp: around the ring), so both ranks name it at once.
  bool named = false;
  for (auto& e : rooted) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const MismatchError& m) {
      named = named || std::string(m.what()).find("root 1") != std::string::npos;
    } catch (const std::exception& other) {
      ADD_FAILURE() << "not a MismatchError: " << other.what();
    }
  }
  EXPECT_TRUE(named) << "a reduce to different roots went unnoticed";
}

// The shm wait's spin budget is a setting; a value out of its range is a
// clear error when the group forms, and an accepted one works.
TEST(ShmSettings, SpinBudgetIsRangeCheckedAndHonoured) {
  ::setenv("LOCKSTEP_SHM_SPIN_US", "5000000", 1);
  try {
    ThreadWorld world(2, "shm", 10s);
    ADD_FAILURE() << "LOCKSTEP_SHM_SPIN_US=5000000 was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_SHM_SPIN_US"), std::string::npos) << e.what();
  }
  ::setenv("LOCKSTEP_SHM_SPIN_US", "0", 1);
  {
    ThreadWorld world(2, "shm", 10s);
    world.run([](int rank, ProcessGroup& pg) {
      std::vector<float> data(3, static_cast<float>(rank + 1));
      pg.allreduce(view(std::span(data)))->wait();
      EXPECT_EQ(data[2], 3.0f);
    });
  }
  ::unsetenv("LOCKSTEP_SHM_SPIN_US");
}

TEST_P(ProcessGroupTest, BarrierWaitsForTheSlowestRank) {
  ThreadWorld world(5, GetParam());
  std::atomic<int> arrived{0};
  world.run([&](int rank, ProcessGroup& pg) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40 * rank));
    arrived++;
    pg.barrier()->wait();
    EXPECT_EQ(arrived.load(), 5);
  });
}

TEST_P(ProcessGroupTest, BadArgumentsAreRejectedAtOnce) {
  ThreadWorld world(2, GetParam());
  auto& pg = world.group(0);
  std::vector<float> in(4), out(5);
  EXPECT_THROW(pg.allgather(const_view(std::span<const float>(in)), view(std::span(out))), InvalidArgument);
  EXPECT_THROW(pg.reduce_scatter(const_view(std::span<const float>(out)), view(std::span(in))), InvalidArgument);
  EXPECT_THROW(pg.broadcast(view(std::span(in)), 2), InvalidArgument);
  EXPECT_THROW(pg.send(const_view(std::span<const float>(in)), 0), InvalidArgument);  // to itself
  EXPECT_THROW(pg.allreduce(Buffer{nullptr, 3, DType::f32}), InvalidArgument);
  std::vector<double> other(8);
  EXPECT_THROW(pg.allgather(const_view(std::span<const float>(in)), view(std::span(other))), InvalidArgument);
  EXPECT_FALSE(pg.aborted());  // argument errors do not break the group
}

// A count whose bytes do not fit the address space is refused where the
// buffer enters, naming the count and the limit: before, 2^62 floats
// (2^64 bytes, which wraps to 0) crashed shm and tcp, and 2^62 + 16 floats
// "succeeded" on tcp (64 bytes moved).
TEST_P(ProcessGroupTest, CountsWhoseBytesOverflowAreRefused) {
  ThreadWorld world(2, GetParam());
  auto& pg = world.group(0);
  std::vector<float> small(16);
  for (const std::size_t count : {std::size_t{1} << 62, (std::size_t{1} << 62) + 16, std::size_t{1} << 61}) {
    SCOPED_TRACE(count);
    try {
      pg.allreduce(Buffer{small.data(), count, DType::f32});
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce: " + std::to_string(count) + " elements of float are more than any buffer can "
                          "hold (at most 2305843009213693951)"),
                std::string::npos)
          << what;
    }
  }
  const ConstBuffer huge_bytes{small.data(), std::size_t{1} << 63, DType::u8};
  EXPECT_THROW(pg.allgather(ConstBuffer{small.data(), 4, DType::f32}, Buffer{small.data(), std::size_t{1} << 62, DType::f32}),
               InvalidArgument);
  EXPECT_THROW(pg.broadcast(Buffer{small.data(), huge_bytes.count, DType::u8}, 0), InvalidArgument);
  EXPECT_THROW(pg.gather(huge_bytes, Buffer{small.data(), 16, DType::u8}, 0), InvalidArgument);
  EXPECT_FALSE(pg.aborted());
}

// The order of new_group's list numbers the new group's ranks, so members
// that list the same ranks in different orders disagree: each names both
// lists. (Before, the lists named two different groups, and each member
// waited for the other until "rank(s) 1 did not join ... same
// MASTER_ADDR/MASTER_PORT".)
TEST_P(ProcessGroupTest, NewGroupWithTheSameRanksInAnotherOrderIsAMismatch) {
  ThreadWorld world(2, GetParam(), 20s);
  const auto start = Clock::now();
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    pg.new_group(rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{1, 0});
  });
  EXPECT_LT(seconds_between(start, Clock::now()), 10.0);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const MismatchError& e) {
      const std::string want = r == 0 ? "new_group: rank 0 passed the ranks [0, 1] but rank 1 passed [1, 0]"
                                      : "new_group: rank 1 passed the ranks [1, 0] but rank 0 passed [0, 1]";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": not a MismatchError: " << e.what();
    }
  }
}

TEST_P(ProcessGroupTest, SubGroupsRunIndependently) {
  ThreadWorld world(4, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    const std::vector<int> evens{0, 2}, odds{3, 1};  // odd group listed out of order on purpose
    auto sub = pg.new_group(rank % 2 == 0 ? evens : odds);
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), rank % 2 == 0 ? rank / 2 : (rank == 3 ? 0 : 1));
    std::vector<std::int32_t> v{rank};
    sub->allreduce(view(std::span(v)))->wait();
    EXPECT_EQ(v[0], rank % 2 == 0 ? 0 + 2 : 1 + 3);
    // The parent still works, interleaved with the sub-group.
    std::vector<std::int32_t> all{1};
    pg.allreduce(view(std::span(all)))->wait();
    EXPECT_EQ(all[0], 4);
    // A second group over the same ranks is a distinct group.
    auto again = pg.new_group(rank % 2 == 0 ? evens : odds);
    std::vector<std::int32_t> w{1};
    again->allreduce(view(std::span(w)))->wait();
    EXPECT_EQ(w[0], 2);
  });
}

TEST_P(ProcessGroupTest, WorldOfOneNeedsNoNetwork) {
  GroupOptions options;
  options.rank = 0;
  options.world_size = 1;
  options.store = std::make_shared<HashStore>();
  auto pg = init_process_group(options);
  std::vector<float> v{1, 2, 3};
  pg->allreduce(view(std::span(v)), ReduceOp::avg)->wait();
  EXPECT_EQ(v[1], 2.0f);
  pg->barrier()->wait();
}

TEST_P(ProcessGroupTest, AStalledPeerIsATimeoutErrorNamingItAndTheCollective) {
  ThreadWorld world(3, GetParam(), 1s);
  std::vector<std::exception_ptr> errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> v(100, 1.0f);
    pg.allreduce(view(std::span(v)))->wait();  // #0: everyone
    if (rank == 2) return;                       // rank 2 skips #1
    pg.allreduce(view(std::span(v)))->wait();
  });
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r;
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(fmt::format("rank {}/3", r)), std::string::npos) << what;
      EXPECT_NE(what.find("allreduce #1"), std::string::npos) << what;
      EXPECT_NE(what.find("rank "), std::string::npos) << what;
      EXPECT_GE(e.peer(), 0) << what;
    }
  }
}

TEST_P(ProcessGroupTest, AfterAFailureLaterOperationsFailFast) {
  ThreadWorld world(2, GetParam(), 1s);
  world.run_collecting([](int rank, ProcessGroup& pg) {
    if (rank == 1) return;
    std::vector<float> v(10);
    EXPECT_THROW(pg.allreduce(view(std::span(v)))->wait(), TimeoutError);
    EXPECT_TRUE(pg.aborted());
    // Refused as it is issued: its Work is done before anyone waits, so
    // no later operation can wait for a timeout again.
    auto later = pg.allreduce(view(std::span(v)));
    EXPECT_TRUE(later->done());
    EXPECT_THROW(later->wait(), TimeoutError);
  });
}

TEST_P(ProcessGroupTest, SmallOperationsMayCompleteOnTheIssuingThread) {
  ThreadWorld world(2, GetParam());
  world.run([](int, ProcessGroup& pg) {
    std::vector<float> v(4, 1.0f);
    auto work = pg.allreduce(view(std::span(v)));
    work->wait();  // whether it ran inline or not, the result is the same
    EXPECT_EQ(v[3], 2.0f);
    EXPECT_GE(work->started_us(), work->issued_us());
  });
}

// Rank 1 issues only once rank 0's short wait has given up, so that wait
// cannot find the operation finished, however the threads are scheduled.
TEST_P(ProcessGroupTest, WaitWithATimeoutReturnsControlToTheCaller) {
  ThreadWorld world(2, GetParam(), 60s);
  std::promise<void> rank0_gave_up;
  std::shared_future<void> gave_up = rank0_gave_up.get_future().share();
  world.run([&](int rank, ProcessGroup& pg) {
    std::vector<float> v(1 << 20, 1.0f);
    if (rank == 1) ASSERT_EQ(gave_up.wait_for(60s), std::future_status::ready);
    auto work = pg.allreduce(view(std::span(v)));
    if (rank == 0) {
      EXPECT_THROW(work->wait(50ms), TimeoutError);
      rank0_gave_up.set_value();
    }
    work->wait();  // the operation itself went on and finished
    EXPECT_EQ(v[0], 2.0f);
  });
}

// Work::then: continuations run after the collective's result is in
// place, in order (chains and siblings alike); a failure reaches every
// continuation's Work without running it; a continuation that throws fails
// its own Work only; waiting on one honours its timeout.
//
// The order is only defined for continuations registered before the
// collective finishes (one registered on a finished Work runs at once), so
// the ranks that check it register before the collective can finish: the
// other ranks issue their part only once the checkers have registered.
// Two rounds, rank 0 checking in the first and ranks 1 and 2 in the second.
TEST_P(ProcessGroupTest, ContinuationsRunInOrderAfterTheCollective) {
  ThreadWorld world(3, GetParam());
  std::latch rank0_registered(1), ranks12_registered(2);
  world.run([&](int rank, ProcessGroup& pg) {
    for (int round = 0; round < 2; ++round) {
      const bool checker = round == 0 ? rank == 0 : rank != 0;
      std::latch& registered = round == 0 ? rank0_registered : ranks12_registered;
      if (!checker) registered.wait();
      std::vector<float> data(1 << 18, 1.0f);
      std::vector<std::string> order;  // written by whichever thread completes the Work, one at a time
      auto reduced = pg.allreduce(view(std::span(data)));
      auto first = reduced->then([&](const Work& w) {
        EXPECT_TRUE(w.error() == nullptr);
        EXPECT_EQ(data.front(), 3.0f);
        EXPECT_EQ(data.back(), 3.0f);
        order.push_back("first");
      });
      auto sibling = reduced->then([&](const Work&) { order.push_back("sibling"); });
      auto second = first->then([&](const Work&) { order.push_back("second"); });
      if (checker) registered.count_down();
      second->wait();
      sibling->wait();
      if (checker) EXPECT_EQ(order, (std::vector<std::string>{"first", "second", "sibling"})) << "round " << round;
      EXPECT_EQ(second->seq(), reduced->seq());
      EXPECT_TRUE(reduced->done());
      EXPECT_GE(second->finished_us(), reduced->finished_us());
    }
  });
}

TEST_P(ProcessGroupTest, AFailedCollectiveFailsItsContinuationsWithoutRunningThem) {
  ThreadWorld world(2, GetParam(), 1s);
  world.run_collecting([](int rank, ProcessGroup& pg) {
    if (rank == 1) return;  // never joins: rank 0's allreduce times out
    std::vector<float> v(1000, 1.0f);
    std::atomic<int> ran{0};
    auto last = pg.allreduce(view(std::span(v)))->then([&](const Work&) { ++ran; })->then([&](const Work&) { ++ran; });
    EXPECT_THROW(last->wait(), TimeoutError);
    EXPECT_EQ(ran.load(), 0);
  });
}

TEST_P(ProcessGroupTest, AContinuationThatThrowsFailsOnlyItsOwnWork) {
  ThreadWorld world(2, GetParam());
  world.run([](int, ProcessGroup& pg) {
    std::vector<float> v(1000, 1.0f);
    bool after_ran = false;
    auto reduced = pg.allreduce(view(std::span(v)));
    auto throwing = reduced->then([](const Work&) { throw InvalidArgument("the continuation's own failure"); });
    auto after = throwing->then([&](const Work&) { after_ran = true; });
    EXPECT_THROW(after->wait(), InvalidArgument);
    EXPECT_FALSE(after_ran);
    reduced->wait();  // the collective itself succeeded
    EXPECT_EQ(v[0], 2.0f);
    std::vector<float> w(1000, 1.0f);
    pg.allreduce(view(std::span(w)))->wait();  // and the group goes on
    EXPECT_EQ(w[0], 2.0f);
  });
}

// Rank 1 issues the allreduce late, so a wait that stopped at the first
// failure would return with the allreduce still writing into `v`.
TEST_P(ProcessGroupTest, WaitAllWaitsForEveryWorkBeforeRethrowingTheFirstFailure) {
  ThreadWorld world(2, GetParam());
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<float> v(1 << 16, 1.0f);
    std::vector<std::shared_ptr<Work>> works;
    works.push_back(pg.barrier()->then([](const Work&) { throw InvalidArgument("the first failure"); }));
    if (rank == 1) std::this_thread::sleep_for(200ms);
    works.push_back(pg.allreduce(view(std::span(v))));
    works.push_back(pg.barrier()->then([](const Work&) { throw TimeoutError("a later failure"); }));
    EXPECT_THROW(wait_all(works), InvalidArgument);
    for (const auto& work : works) EXPECT_TRUE(work->done()) << work->description();
    EXPECT_EQ(v.front(), 2.0f);
    EXPECT_EQ(v.back(), 2.0f);
    wait_all({});  // nothing to wait for
  });
}

// As above: rank 1 issues only once rank 0's short wait has given up.
TEST_P(ProcessGroupTest, WaitingOnAContinuationHonoursItsTimeout) {
  ThreadWorld world(2, GetParam(), 60s);
  std::promise<void> rank0_gave_up;
  std::shared_future<void> gave_up = rank0_gave_up.get_future().share();
  world.run([&](int rank, ProcessGroup& pg) {
    std::vector<float> v(1 << 20, 1.0f);
    std::atomic<bool> started{false};
    if (rank == 1) ASSERT_EQ(gave_up.wait_for(60s), std::future_status::ready);
    auto next = pg.allreduce(view(std::span(v)))->then([&](const Work&) { started = true; });
    if (rank == 0) {
      EXPECT_THROW(next->wait(50ms), TimeoutError);
      EXPECT_FALSE(started.load());
      rank0_gave_up.set_value();
    }
    next->wait();
    EXPECT_TRUE(started.load());
    EXPECT_EQ(v[0], 2.0f);
  });
}

// Backend choice across (pretend) hosts: auto takes hier where a host runs
// several ranks and tcp where every host runs one; hier on one host is shm.
TEST(HierSelection, AutoPicksHierWhenAHostRunsSeveralRanks) {
  ThreadWorld world(4, "auto", 10s, {}, testing::pretend_hosts({2, 2}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(world.group(r).backend(), "hier");
}

TEST(HierSelection, AutoPicksTcpWhenEveryHostRunsOneRank) {
  ThreadWorld world(2, "auto", 10s, {}, testing::pretend_hosts({1, 1}));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(world.group(r).backend(), "tcp");
}

TEST(HierSelection, HierOnOneHostIsShm) {
  ThreadWorld world(2, "hier", 10s);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(world.group(r).backend(), "shm");
}

TEST(HierSelection, SubGroupsInsideAHostUseShmAndAcrossHostsHier) {
  ThreadWorld world(4, "hier", 10s, {}, testing::pretend_hosts({2, 2}));
  world.run([](int rank, ProcessGroup& pg) {
    const std::vector<int> same_host = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    const std::vector<int> across = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto local = pg.new_group(same_host);
    auto spanning = pg.new_group(across);
    EXPECT_EQ(local->backend(), "shm");
    EXPECT_EQ(spanning->backend(), "hier");
    std::vector<std::int32_t> a{rank}, b{rank};
    local->allreduce(view(std::span(a)))->wait();
    spanning->allreduce(view(std::span(b)))->wait();
    EXPECT_EQ(a[0], rank < 2 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(b[0], rank % 2 == 0 ? 0 + 2 : 1 + 3);
  });
}

// hier1: every rank its own pretend host (the cross-host path alone);
// hier2: hosts of two ranks (shm inside, uneven hosts with 3 ranks).
// A collective's deadline is measured on the group's clock (GroupOptions::
// os), which the backends read where they wait: moved on past the 60 s
// timeout, it ends rank 0's allreduce at once. Rank 1 never issues; it
// moves the clock until rank 0's operation is over.
TEST_P(ProcessGroupTest, ACollectiveTimesOutOnTheGroupsClock) {
  testing::ManualClock clock;
  GroupOptions extra;
  extra.os = &clock;
  ThreadWorld world(2, GetParam(), 60s, extra);
  std::promise<std::shared_ptr<Work>> rank0_work;
  std::shared_future<std::shared_ptr<Work>> issued = rank0_work.get_future().share();
  const auto start = Clock::now();
  world.run_collecting([&](int rank, ProcessGroup& pg) {
    if (rank == 1) {
      ASSERT_EQ(issued.wait_for(60s), std::future_status::ready);
      const auto work = issued.get();
      EXPECT_TRUE(testing::advance_until(clock, 5s, [&] { return work->done(); })) << "the deadline never expired";
      return;
    }
    std::vector<float> data(1 << 20, 1.0f);  // large: it runs on the progress thread, so the issue returns
    auto work = pg.allreduce(view(std::span(data)));
    rank0_work.set_value(work);
    EXPECT_THROW(work->wait(), TimeoutError);
  });
  EXPECT_LT(seconds_between(start, Clock::now()), 40.0) << "the 60 s timeout was waited out in real time";
}

// The rendezvous's timeout is on the group's clock too: a rank that never
// comes is named once the clock passes it, however little real time went by.
TEST(Rendezvous, ARankThatNeverJoinsIsNamedOnceTheGroupsClockPassesTheTimeout) {
  testing::ManualClock clock;
  GroupOptions options;
  options.config = testing::bare_config();
  options.rank = 0;
  options.world_size = 2;
  options.backend = "tcp";
  options.store = std::make_shared<HashStore>();
  options.timeout = 60s;
  options.os = &clock;
  auto joining = std::async(std::launch::async, [&] { return init_process_group(options); });
  const auto ready = [&] { return joining.wait_for(0s) == std::future_status::ready; };
  ASSERT_TRUE(testing::advance_until(clock, 10s, ready)) << "the rendezvous never timed out";
  try {
    joining.get();
    ADD_FAILURE() << "a group of two formed with one rank";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("(rank(s) 1) did not join within 60 s"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ProcessGroupTest, ::testing::Values("tcp", "shm", "hier1", "hier2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
