// Behaviour of the block collectives and premul_sum beyond their results
// (the sweep checks those): bad arguments are InvalidArgument before
// anything is sent, and ranks that disagree on per-rank counts or on the
// collective fail with a MismatchError naming the ranks, never with wrong
// data. On tcp, shm and hier (pretend hosts of two ranks), thread ranks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "harness/thread_world.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::ThreadWorld;

class BlockCollectivesTest : public ::testing::TestWithParam<std::string> {};

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

template <typename E>
bool is(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

TEST_P(BlockCollectivesTest, MismatchedSplitSizesFailOnEveryRankNamingThePair) {
  ThreadWorld world(3, GetParam(), 10s);
  // Rank 0 sends 3 elements to rank 1, which expects 2 from it; every other
  // pair agrees.
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<std::size_t> sends{2, 2, 2}, recvs{2, 2, 2};
    if (rank == 0) sends = {2, 3, 2};
    std::vector<float> in(std::accumulate(sends.begin(), sends.end(), std::size_t{0}), 1.0f);
    std::vector<float> out(std::accumulate(recvs.begin(), recvs.end(), std::size_t{0}));
    pg.all_to_all(const_view(std::span<const float>(in)), sends, view(std::span(out)), recvs)->wait();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(r)]) << "rank " << r << " did not fail";
    EXPECT_TRUE(is<MismatchError>(errors[static_cast<std::size_t>(r)])) << message_of(errors[static_cast<std::size_t>(r)]);
    EXPECT_NE(message_of(errors[static_cast<std::size_t>(r)]).find("rank 0 sends 3 elements to rank 1, which expects 2"),
              std::string::npos)
        << message_of(errors[static_cast<std::size_t>(r)]);
  }
}

TEST_P(BlockCollectivesTest, AllgatherWithDifferentCountsIsAMismatch) {
  ThreadWorld world(3, GetParam(), 10s);
  // Rank 2 believes rank 0 contributes 5 elements and rank 1 three; the
  // others say 4 each. The totals agree (12), only the counts differ.
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<std::size_t> counts = rank == 2 ? std::vector<std::size_t>{5, 3, 4} : std::vector<std::size_t>{4, 4, 4};
    std::vector<float> in(counts[static_cast<std::size_t>(rank)], 1.0f);
    std::vector<float> out(12);
    pg.allgather(const_view(std::span<const float>(in)), view(std::span(out)), counts)->wait();
  });
  int mismatches = 0;
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    if (is<MismatchError>(e)) {
      ++mismatches;
      EXPECT_NE(message_of(e).find("different per-rank counts"), std::string::npos) << message_of(e);
    }
  }
  EXPECT_GE(mismatches, 1);
}

// Neither side of a gather against a scatter sends to the other (on tcp
// both wait to receive from each other): every rank fails, at the latest
// at the deadline, and on shm, where the stamps are in shared memory, as a
// MismatchError at once.
TEST_P(BlockCollectivesTest, GatherAgainstScatterFailsOnEveryRank) {
  ThreadWorld world(2, GetParam(), 2s);
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> a(2000, 1.0f), b(4000);
    if (rank == 0)
      pg.gather(const_view(std::span<const float>(a)), view(std::span(b)), 0)->wait();
    else
      pg.scatter({}, view(std::span(a)), 0)->wait();
  });
  int mismatches = 0;
  for (const auto& e : errors) {
    EXPECT_TRUE(e);
    if (e && is<MismatchError>(e)) ++mismatches;
  }
  if (GetParam() == "shm") EXPECT_GE(mismatches, 1) << (errors[0] ? message_of(errors[0]) : "") << " / " << (errors[1] ? message_of(errors[1]) : "");
}

TEST_P(BlockCollectivesTest, BadArgumentsAreInvalidArgumentBeforeAnythingRuns) {
  ThreadWorld world(2, GetParam(), 5s);
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<float> f(8);
    std::vector<double> d(8);
    std::vector<std::int32_t> i(8);
    const auto fin = const_view(std::span<const float>(f));
    std::vector<float> out(8);
    if (rank == 0) EXPECT_THROW(pg.gather(fin, Buffer{d.data(), 16, DType::f64}, 0), InvalidArgument) << "dtypes differ";
    EXPECT_THROW(pg.gather(fin, view(std::span(f)), 2), InvalidArgument);  // no rank 2
    if (rank == 0)
      EXPECT_THROW(pg.scatter(const_view(std::span<const float>(f)), Buffer{out.data(), 3, DType::f32}, 0),
                   InvalidArgument)
          << "root's input is not size() x output";
    EXPECT_THROW(pg.all_to_all(fin, Buffer{out.data(), 7, DType::f32}), InvalidArgument);
    EXPECT_THROW(pg.all_to_all(ConstBuffer{f.data(), 7, DType::f32}, Buffer{out.data(), 7, DType::f32}), InvalidArgument)
        << "7 does not split in 2";
    EXPECT_THROW(pg.all_to_all(fin, {4, 3}, view(std::span(out)), {4, 4}), InvalidArgument) << "counts add up to 7";
    EXPECT_THROW(pg.all_to_all(fin, {8}, view(std::span(out)), {8}), InvalidArgument) << "one count per rank";
    EXPECT_THROW(pg.all_to_all(fin, Buffer{f.data(), 8, DType::f32}), InvalidArgument) << "same memory";
    EXPECT_THROW(pg.allgather(ConstBuffer{f.data(), 3, DType::f32}, view(std::span(out)), {4, 4}), InvalidArgument);
    EXPECT_THROW(pg.allreduce(view(std::span(i)), Reduction::premul_sum(0.5)), InvalidArgument) << "integers";
    EXPECT_FALSE(pg.aborted());
  });
}

TEST_P(BlockCollectivesTest, PremulSumScalesBeforeSumming) {
  ThreadWorld world(3, GetParam(), 10s);
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<double> data(5, static_cast<double>(rank + 1));  // 1, 2, 3
    pg.allreduce(view(std::span(data)), Reduction::premul_sum(0.25))->wait();
    for (double v : data) EXPECT_DOUBLE_EQ(v, 1.5);  // (1 + 2 + 3) / 4
  });
}

// LOCKSTEP_DEBUG=DETAIL compares every collective's fingerprint across
// ranks before it runs: an all_to_all whose totals differ by rank (as per-
// rank counts allow) must pass, and gather's root must be compared.
TEST_P(BlockCollectivesTest, DetailChecksAcceptPerRankTotalsAndCompareRoots) {
  ::setenv("LOCKSTEP_DEBUG", "DETAIL", 1);
  ThreadWorld world(2, GetParam(), 10s);
  ::unsetenv("LOCKSTEP_DEBUG");
  world.run([](int rank, ProcessGroup& pg) {
    // Rank 0 sends 1 element to each rank, rank 1 sends 3 to each.
    const std::size_t each = rank == 0 ? 1 : 3;
    std::vector<float> in(2 * each, static_cast<float>(rank)), out(4);
    pg.all_to_all(const_view(std::span<const float>(in)), {each, each}, view(std::span(out)), {1, 3})->wait();
    EXPECT_EQ(out, (std::vector<float>{0, 1, 1, 1}));
  });
  auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    std::vector<float> in(4), out(8);
    pg.gather(const_view(std::span<const float>(in)), view(std::span(out)), /*root=*/rank)->wait();
  });
  for (const auto& e : errors) {
    ASSERT_TRUE(e);
    EXPECT_NE(message_of(e).find("LOCKSTEP_DEBUG=DETAIL found that the ranks disagree"), std::string::npos)
        << message_of(e);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BlockCollectivesTest, ::testing::Values("tcp", "shm", "hier2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
