// The mpi backend beyond the sweep, on real MPI processes (ctest starts this
// binary under mpirun; every rank runs every test): point to point and its
// mismatches, receives from any source, sub-groups, concurrent groups,
// bitwise-identical results, NaN and signed-zero semantics, ranks that
// disagree with MPI's, and (run separately, with LOCKSTEP_TIMEOUT=2) a rank
// that skips a collective.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstring>
#include <random>
#include <thread>

#include "comm/recv_any_cases.h"
#include "comm/reference.h"
#include "common/clock.h"
#include "common/half.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::compare_elements;
using testing::make_input;

// A world group on the mpi backend. Each test forms its own, so a test that
// aborts its group leaves the next one a healthy group.
std::shared_ptr<ProcessGroup> mpi_world(const std::string& name) {
  GroupOptions options;
  options.backend = "mpi";
  options.name = name;
  return init_process_group(options);
}

// Every rank's copy of `bytes` bytes at `data`, gathered in rank order.
std::vector<std::byte> gather_bytes(ProcessGroup& pg, const void* data, std::size_t bytes) {
  std::vector<std::byte> all(bytes * static_cast<std::size_t>(pg.size()));
  pg.allgather(ConstBuffer{data, bytes, DType::u8}, Buffer{all.data(), all.size(), DType::u8})->wait();
  return all;
}

TEST(MpiPointToPoint, PayloadsOfEverySizeAndDtypeArriveIntact) {
  auto pg = mpi_world("p2p");
  if (pg->rank() > 1) return;  // ranks 0 and 1 talk; the others have nothing to do
  const int peer = 1 - pg->rank();
  int tag = 0;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{5000}, std::size_t{1048579}}) {
    for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::i64, DType::u8}) {
      // Both directions, in an order that cannot deadlock: 0 sends first.
      for (int sender : {0, 1}) {
        ++tag;
        auto payload = make_input(sender, count, dtype, ReduceOp::sum);
        if (pg->rank() == sender) {
          pg->send(ConstBuffer{payload.data(), count, dtype}, peer, tag)->wait();
        } else {
          std::vector<std::byte> got(payload.size(), std::byte{0x5a});
          pg->recv(Buffer{got.data(), count, dtype}, peer, tag)->wait();
          EXPECT_EQ(compare_elements(got.data(), payload.data(), count, dtype), "")
              << count << " x " << dtype << " from rank " << sender;
        }
      }
    }
  }
}

// Rank 0 sends `sent`, rank 1 expects `expected`: rank 1 must fail with a
// MismatchError whose message has every fragment, rank 0's send succeeds.
void expect_mismatch(const std::string& name, ConstBuffer sent, int sent_tag, Buffer expected, int expected_tag,
                     const std::vector<std::string>& fragments) {
  auto pg = mpi_world(name);
  if (pg->rank() == 0) {
    EXPECT_NO_THROW(pg->send(sent, 1, sent_tag)->wait());
  } else if (pg->rank() == 1) {
    try {
      pg->recv(expected, 0, expected_tag)->wait();
      ADD_FAILURE() << "a mismatched recv succeeded";
    } catch (const MismatchError& e) {
      for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
    EXPECT_TRUE(pg->aborted());
  }
}

TEST(MpiPointToPoint, MismatchedTagIsAMismatchErrorNamingBothSides) {
  // 400 KB: beyond MPI's eager limit, so the sender completes only because
  // the receiver takes the payload despite the mismatch.
  std::vector<float> out(100000, 1.0f), in(100000);
  expect_mismatch("mismatch-tag", const_view(std::span<const float>(out)), 1, view(std::span(in)), 2,
                  {"rank 1/", "recv #", "from rank 0", "expected tag 2", "sent tag 1"});
}

TEST(MpiPointToPoint, MismatchedSizeIsAMismatchError) {
  std::vector<float> out(12, 1.0f), in(10);
  expect_mismatch("mismatch-size", const_view(std::span<const float>(out)), 5, view(std::span(in)), 5,
                  {"expected tag 5, 10 x float (40 bytes)", "sent tag 5, 48 bytes of float"});
}

TEST(MpiPointToPoint, MismatchedDtypeIsAMismatchError) {
  std::vector<std::int32_t> out(10, 1);
  std::vector<float> in(10);
  expect_mismatch("mismatch-dtype", const_view(std::span<const std::int32_t>(out)), 0, view(std::span(in)), 0,
                  {"10 x float", "40 bytes of int32"});
}

// Receives from any source (MPI_ANY_SOURCE underneath): rank 0 takes every
// other rank's numbered messages, small and large (past the eager limit),
// checking content, reported source and each sender's order.
TEST(MpiRecvAny, EverySendersMessagesArriveWholeOnceAndInOrderWithTheirSource) {
  auto pg = mpi_world("recv-any");
  for (std::size_t count : {std::size_t{16}, std::size_t{40'000}}) {
    SCOPED_TRACE(std::to_string(count) + " elements");
    if (pg->rank() == 0) testing::receive_from_every_sender(*pg, /*messages=*/6, count);
    else testing::send_numbered_messages(*pg, 0, /*messages=*/6, count);
    // A sender's send may complete before rank 0 takes it: without the
    // barrier, a sender could start on the next size while rank 0 still
    // takes this size from the others, and its message would be the first.
    pg->barrier()->wait();
  }
}

// The last rank sends 10 floats where rank 0's recv_any expects 20: rank 0
// fails naming that rank, whose send completes.
TEST(MpiRecvAny, AMismatchedMessageIsAMismatchErrorNamingItsSender) {
  auto pg = mpi_world("recv-any-mismatch");
  const int sender = pg->size() - 1;
  std::vector<float> buf(20, 1.0f);
  if (pg->rank() == sender) {
    EXPECT_NO_THROW(pg->send(ConstBuffer{buf.data(), 10, DType::f32}, 0, 3)->wait());
  } else if (pg->rank() == 0) {
    try {
      pg->recv_any(view(std::span(buf)), 3)->wait();
      ADD_FAILURE() << "a mismatched recv_any succeeded";
    } catch (const MismatchError& e) {
      const std::string what = e.what();
      const std::string from = "from rank " + std::to_string(sender);
      EXPECT_NE(what.find("from any rank"), std::string::npos) << what;
      EXPECT_NE(what.find(from + " expected tag 3, 20 x float (80 bytes)"), std::string::npos) << what;
      EXPECT_NE(what.find("but rank " + std::to_string(sender) + " sent tag 3, 40 bytes of float"), std::string::npos)
          << what;
    }
    EXPECT_TRUE(pg->aborted());
  }
}

TEST(MpiSubGroups, OnlyTheListedRanksTakePartAndInTheListedOrder) {
  auto world = mpi_world("subgroups");
  const int n = world->size(), r = world->rank();
  // The world in reverse: sub-rank i is world rank n-1-i.
  std::vector<int> reversed;
  for (int q = n - 1; q >= 0; --q) reversed.push_back(q);
  auto backwards = world->new_group(reversed);
  EXPECT_EQ(backwards->backend(), "mpi");
  EXPECT_EQ(backwards->rank(), n - 1 - r);
  std::int64_t mine = r;
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  backwards->allgather(ConstBuffer{&mine, 1, DType::i64}, view(std::span(order)))->wait();
  for (int i = 0; i < n; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], n - 1 - i);

  // Ranks 0 and n-1 only; the ranks between do not call new_group at all.
  if (r == 0 || r == n - 1) {
    auto ends = world->new_group({n - 1, 0});
    std::vector<float> v(300000, static_cast<float>(r + 1));
    ends->allreduce(view(std::span(v)))->wait();
    EXPECT_EQ(v.front(), static_cast<float>(n + 1));
    EXPECT_EQ(v.back(), static_cast<float>(n + 1));
  }

  // A group of one: every collective is this rank's own data.
  auto alone = world->new_group({r});
  std::vector<double> v(10, 2.5);
  alone->allreduce(view(std::span(v)), ReduceOp::avg)->wait();
  EXPECT_EQ(v[9], 2.5);
  world->barrier()->wait();
}

TEST(MpiSubGroups, GroupsRunConcurrentlyOnTheirOwnThreads) {
  auto world = mpi_world("concurrent");
  const int n = world->size(), r = world->rank();
  std::vector<int> reversed;
  for (int q = n - 1; q >= 0; --q) reversed.push_back(q);
  auto other = world->new_group(reversed);
  // Small operations run inline on the caller's thread, large ones on the
  // progress threads: both paths at once, on two groups, from two threads.
  const auto hammer = [n, r](ProcessGroup& pg, std::vector<std::string>& errors) {
    for (int i = 0; i < 40; ++i) {
      std::vector<float> v(i % 2 ? 16 : 200000, static_cast<float>(r + i));
      pg.allreduce(view(std::span(v)))->wait();
      const float want = static_cast<float>(n * i + n * (n - 1) / 2);
      if (v.front() != want || v.back() != want) errors.push_back("iteration " + std::to_string(i));
    }
  };
  std::vector<std::string> world_errors, other_errors;
  std::thread t([&] { hammer(*other, other_errors); });
  hammer(*world, world_errors);
  t.join();
  EXPECT_TRUE(world_errors.empty()) << world_errors.front();
  EXPECT_TRUE(other_errors.empty()) << other_errors.front();
}

TEST(MpiResults, BitwiseIdenticalOnEveryRank) {
  auto pg = mpi_world("bitwise");
  const int n = pg->size(), r = pg->rank();
  std::mt19937 rng(static_cast<unsigned>(r * 7919 + 1));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::size_t count : {std::size_t{100}, std::size_t{300000}}) {
    std::vector<float> f(count), mn(count);
    std::vector<std::uint16_t> h(count), b(count);
    for (std::size_t i = 0; i < count; ++i) {
      f[i] = dist(rng) * 1e3f;  // sums of these round: the order matters
      mn[i] = dist(rng);
      h[i] = float_to_half(dist(rng));
      b[i] = float_to_bf16(dist(rng));
    }
    pg->allreduce(view(std::span(f)))->wait();
    pg->allreduce(view(std::span(mn)), ReduceOp::min)->wait();
    pg->allreduce(Buffer{h.data(), count, DType::f16}, ReduceOp::sum)->wait();
    pg->allreduce(Buffer{b.data(), count, DType::bf16}, ReduceOp::avg)->wait();
    for (auto [data, bytes] : {std::pair<const void*, std::size_t>{f.data(), count * 4}, {mn.data(), count * 4},
                               {h.data(), count * 2}, {b.data(), count * 2}}) {
      const auto all = gather_bytes(*pg, data, bytes);
      for (int q = 1; q < n; ++q)
        EXPECT_EQ(std::memcmp(all.data(), all.data() + static_cast<std::size_t>(q) * bytes, bytes), 0)
            << "rank " << q << " differs from rank 0 (" << count << " elements)";
    }
  }
}

// min/max as the other backends compute them, in rank order: a NaN wins,
// and of equal values (-0 and +0) the lowest rank's wins.
TEST(MpiResults, MinAndMaxPropagateNaNAndKeepTheLowestRanksZero) {
  auto pg = mpi_world("nan");
  const int r = pg->rank();
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      // [0]: NaN on rank 1; [1]: +0 on rank 0, -0 elsewhere; [2]: the reverse.
      const double values[3] = {r == 1 ? std::nan("") : 1.0, r == 0 ? 0.0 : -0.0, r == 0 ? -0.0 : 0.0};
      std::vector<std::byte> buf(3 * dtype_size(dtype));
      for (int i = 0; i < 3; ++i) testing::store_value(buf.data(), dtype, static_cast<std::size_t>(i), values[i]);
      pg->allreduce(Buffer{buf.data(), 3, dtype}, op)->wait();
      EXPECT_TRUE(std::isnan(testing::load_value(buf.data(), dtype, 0))) << dtype << " " << op;
      EXPECT_FALSE(std::signbit(testing::load_value(buf.data(), dtype, 1))) << dtype << " " << op;
      EXPECT_TRUE(std::signbit(testing::load_value(buf.data(), dtype, 2))) << dtype << " " << op;
    }
  }
}

TEST(MpiConfig, RanksThatDifferFromMpisAreAConfigErrorOnEveryRank) {
  auto world = mpi_world("config");
  GroupOptions options;
  options.backend = "mpi";
  options.name = "shifted";
  options.store = world->store();
  options.world_size = world->size();
  options.rank = (world->rank() + 1) % world->size();  // as if RANK were set differently from mpirun's
  options.connect_timeout = 30s;
  try {
    init_process_group(options);
    ADD_FAILURE() << "a world whose ranks are not MPI's was formed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_COMM_WORLD rank"), std::string::npos) << e.what();
  }
  world->barrier()->wait();  // the world is unharmed
}

// MPI matches collectives by order alone: before the check, ranks that
// disagreed reduced unrelated data, broadcast from different roots, or
// hung in different collectives. Now every rank raises MismatchError at
// the collective, naming its operation and another rank's.
void expect_mismatch_on_this_rank(const std::string& name, const std::function<void(ProcessGroup&)>& disagree,
                                  const std::string& fragment) {
  auto pg = mpi_world(name);
  const auto start = Clock::now();
  try {
    disagree(*pg);
    ADD_FAILURE() << name << ": rank " << pg->rank() << " went on";
  } catch (const MismatchError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not match what rank"), std::string::npos) << what;
    EXPECT_NE(what.find(fragment), std::string::npos) << what;
  }
  EXPECT_LT(seconds_between(start, Clock::now()), 10.0) << name << ": found by a timeout, not by the check";
}

TEST(MpiMismatch, CountsThatDifferAreAMismatchErrorOnEveryRank) {
  expect_mismatch_on_this_rank("mismatch-count", [](ProcessGroup& pg) {
    std::vector<float> v(pg.rank() == 0 ? 1000 : 1001, 1.0f);
    pg.allreduce(view(std::span(v)))->wait();
  }, "allreduce #0 (float x 100");
}

TEST(MpiMismatch, RootsThatDifferAreAMismatchErrorOnEveryRank) {
  expect_mismatch_on_this_rank("mismatch-root", [](ProcessGroup& pg) {
    std::vector<float> v(3, static_cast<float>(pg.rank()));
    pg.broadcast(view(std::span(v)), pg.rank())->wait();
  }, "broadcast #0 (float x 3, root ");
}

TEST(MpiMismatch, DifferentCollectivesAreAMismatchErrorOnEveryRank) {
  expect_mismatch_on_this_rank("mismatch-collective", [](ProcessGroup& pg) {
    std::vector<double> v(10, 1.0);
    if (pg.rank() == 0) pg.broadcast(view(std::span(v)), 0)->wait();
    else pg.allreduce(view(std::span(v)))->wait();
  }, "double x 10");
}

// Run on its own, with LOCKSTEP_TIMEOUT=2 (see tests/CMakeLists.txt).
TEST(MpiTimeout, ARankThatSkipsACollectiveIsATimeoutOnTheOthers) {
  auto pg = mpi_world("timeout");
  ASSERT_EQ(pg->timeout(), 2s) << "run with LOCKSTEP_TIMEOUT=2";
  constexpr int kSkipper = 1;
  const int n = pg->size(), r = pg->rank();
  std::vector<std::string> done_keys;
  for (int q = 0; q < n; ++q)
    if (q != kSkipper) done_keys.push_back("test/timed-out/" + std::to_string(q));
  if (r == kSkipper) {
    // Skip the allreduce; stay until the others have seen their timeouts.
    pg->store()->wait(done_keys, 60s);
    return;
  }
  std::vector<float> v(1000, 1.0f);
  const auto start = Clock::now();
  try {
    pg->allreduce(view(std::span(v)))->wait();
    ADD_FAILURE() << "the allreduce completed without rank " << kSkipper;
  } catch (const TimeoutError& e) {
    // Not before its 2 s deadline; the upper bound only catches a wait for
    // the skipper's 60 s (a load spike cannot stretch 2 s that far).
    const double waited = seconds_between(start, Clock::now());
    EXPECT_GE(waited, 1.9);
    EXPECT_LT(waited, 40.0);
    const std::string what = e.what();
    for (const char* fragment : {"allreduce #", "timed out after 2.0 s", "MPI cannot say which", "LOCKSTEP_TIMEOUT"})
      EXPECT_NE(what.find(fragment), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(r) + "/"), std::string::npos) << what;
  }
  EXPECT_TRUE(pg->aborted());
  // Later operations fail at once instead of waiting again: refused as
  // they are issued, their Work is done before anyone waits.
  auto later = pg->barrier();
  EXPECT_TRUE(later->done());
  EXPECT_THROW(later->wait(), TimeoutError);
  pg->store()->set("test/timed-out/" + std::to_string(r), "1");
}

TEST(MpiTimeout, ARecvFromASilentRankIsATimeoutNamingIt) {
  auto pg = mpi_world("silent");
  ASSERT_EQ(pg->timeout(), 2s) << "run with LOCKSTEP_TIMEOUT=2";
  if (pg->rank() == 1) {
    pg->store()->wait({"test/gave-up"}, 60s);  // never sends
    return;
  }
  if (pg->rank() != 0) return;
  std::vector<float> v(10);
  try {
    pg->recv(view(std::span(v)), 1, 7)->wait();
    ADD_FAILURE() << "a recv completed without a send";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("waiting for rank 1"), std::string::npos) << e.what();
  }
  pg->store()->set("test/gave-up", "1");
}

TEST(MpiTimeout, ARecvFromAnySourceNoRankAnswersIsATimeoutSayingSo) {
  auto pg = mpi_world("silent-any");
  ASSERT_EQ(pg->timeout(), 2s) << "run with LOCKSTEP_TIMEOUT=2";
  if (pg->rank() != 0) {
    pg->store()->wait({"test/any-gave-up"}, 60s);  // never sends
    return;
  }
  std::vector<float> v(10);
  try {
    pg->recv_any(view(std::span(v)), 7)->wait();
    ADD_FAILURE() << "a recv_any completed without a send";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for a message from any rank"), std::string::npos) << e.what();
  }
  pg->store()->set("test/any-gave-up", "1");
}

}  // namespace
}  // namespace lockstep
