// ProcessGroup::allocate_shared and the single-copy allreduce it enables on
// the shm backend: results equal the reference over whole buffers and
// sub-ranges, a rank using ordinary memory while others use shared memory
// still gets the right answer, and on other backends it is plain memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "collective_cases.h"
#include "harness/thread_world.h"
#include "reference.h"

namespace lockstep {
namespace {

using testing::compare_elements;
using testing::make_input;
using testing::expected_results;
using testing::ThreadWorld;

class SharedBuffers : public ::testing::TestWithParam<std::string> {};

TEST_P(SharedBuffers, AllreduceOverSharedMemoryMatchesTheReference) {
  for (int n : {2, 3}) {
    ThreadWorld world(n, GetParam());
    std::mutex mutex;
    std::vector<std::string> failures;
    world.run([&](int rank, ProcessGroup& pg) {
      const std::size_t capacity = 8u << 20;
      auto shared = pg.allocate_shared(capacity);
      ASSERT_TRUE(shared);
      for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          // The whole of a multi-round buffer, and a range at an odd offset.
          for (auto [offset_elems, count] : {std::pair<std::size_t, std::size_t>{0, 300001}, {77, 1000003}}) {
            const std::size_t elem = dtype_size(dtype);
            std::byte* at = shared.get() + offset_elems * elem;
            const auto input = make_input(rank, count, dtype, op);
            std::memcpy(at, input.data(), count * elem);
            pg.allreduce(Buffer{at, count, dtype}, op)->wait();
            const auto want = expected_results(dtype, count, 0, n, op);
            std::string diff = compare_elements(at, want.data(), count, dtype);
            if (!diff.empty()) {
              std::lock_guard lock(mutex);
              failures.push_back(fmt::format("rank {}/{} {} {}: {}", rank, n, dtype, op, diff));
            }
          }
        }
      }
    });
    EXPECT_TRUE(failures.empty()) << failures.front();
  }
}

TEST_P(SharedBuffers, ARankWithOrdinaryMemoryStillGetsTheRightAnswer) {
  ThreadWorld world(3, GetParam());
  world.run([&](int rank, ProcessGroup& pg) {
    const std::size_t count = 1 << 20;
    auto shared = pg.allocate_shared(count * sizeof(float));
    std::vector<float> plain(count);
    float* data = rank == 1 ? plain.data() : reinterpret_cast<float*>(shared.get());
    for (int round = 0; round < 3; ++round) {
      std::fill(data, data + count, static_cast<float>(rank + round));
      pg.allreduce(Buffer{data, count, DType::f32})->wait();
      ASSERT_EQ(data[0], static_cast<float>(3 * round + 3));
      ASSERT_EQ(data[count - 1], static_cast<float>(3 * round + 3));
    }
  });
}

TEST_P(SharedBuffers, RepeatedUseOfOneBufferNeverReadsStaleData) {
  // The caller overwrites its buffers right after each allreduce returns:
  // peers must be done reading them, and done writing results into them
  // (each chunk's owner writes the reduced chunk into every rank's output),
  // in place and out of place. Every element is checked: a late write lands
  // anywhere.
  for (int n : {2, 3}) {
    for (const bool in_place : {true, false}) {
      ThreadWorld world(n, GetParam());
      world.run([&](int rank, ProcessGroup& pg) {
        const std::size_t count = 3 << 20;
        auto input_memory = pg.allocate_shared(count * sizeof(std::int32_t));
        auto output_memory = pg.allocate_shared(count * sizeof(std::int32_t));
        auto* in = reinterpret_cast<std::int32_t*>(input_memory.get());
        auto* out = in_place ? in : reinterpret_cast<std::int32_t*>(output_memory.get());
        const std::int32_t ranks_sum = n * (n + 1) / 2;
        for (int i = 0; i < 20; ++i) {
          std::fill(in, in + count, (rank + 1) * (i + 1));
          if (!in_place) std::fill(out, out + count, -1);
          pg.allreduce(ConstBuffer{in, count, DType::i32}, Buffer{out, count, DType::i32})->wait();
          const auto wrong = std::count_if(out, out + count, [&](std::int32_t x) { return x != ranks_sum * (i + 1); });
          ASSERT_EQ(wrong, 0) << n << " ranks, " << (in_place ? "in place" : "out of place") << ", iteration " << i;
        }
      });
    }
  }
}

TEST_P(SharedBuffers, MemoryIsZeroedAlignedAndMayOutliveTheGroup) {
  std::vector<std::shared_ptr<std::byte[]>> kept(2);
  {
    ThreadWorld world(2, GetParam());
    world.run([&](int rank, ProcessGroup& pg) {
      auto b = pg.allocate_shared(100);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.get()) % 64, 0u);
      for (int i = 0; i < 100; ++i) ASSERT_EQ(b[i], std::byte{0});
      kept[static_cast<std::size_t>(rank)] = b;
    });
  }
  kept[0][99] = std::byte{7};  // still mapped after the group is gone
  EXPECT_EQ(kept[0][99], std::byte{7});
}

TEST_P(SharedBuffers, OutOfPlaceAllreduceFillsTheOutputAndLeavesTheInput) {
  struct Case {
    const char* name;
    bool input_shared, output_shared, rank1_plain;
    std::size_t count;
  };
  const Case cases[] = {{"shared to shared", true, true, false, 700001},
                        {"shared to shared, rank 1 in ordinary memory", true, true, true, 700001},
                        {"ordinary to shared", false, true, false, 700001},
                        {"shared to ordinary", true, false, false, 700001},
                        {"small", true, true, false, 1000}};
  for (int n : {2, 3}) {
    ThreadWorld world(n, GetParam());
    world.run([&](int rank, ProcessGroup& pg) {
      const std::size_t capacity = 700001;
      auto shared_in = pg.allocate_shared(capacity * sizeof(float));
      auto shared_out = pg.allocate_shared(capacity * sizeof(float));
      std::vector<float> plain_in(capacity), plain_out(capacity);
      for (const Case& c : cases) {
        const bool plain = c.rank1_plain && rank == 1;
        float* in = c.input_shared && !plain ? reinterpret_cast<float*>(shared_in.get()) : plain_in.data();
        float* out = c.output_shared && !plain ? reinterpret_cast<float*>(shared_out.get()) : plain_out.data();
        for (std::size_t k = 0; k < c.count; ++k) {
          in[k] = static_cast<float>(rank + 1) + static_cast<float>(k % 7);
          out[k] = -1.0f;
        }
        pg.allreduce(ConstBuffer{in, c.count, DType::f32}, Buffer{out, c.count, DType::f32}, ReduceOp::avg)->wait();
        for (std::size_t k : {std::size_t{0}, std::size_t{1}, c.count / 2, c.count - 1}) {
          ASSERT_EQ(out[k], static_cast<float>(n + 1) / 2.0f + static_cast<float>(k % 7)) << c.name << ", n " << n << ", element " << k;
          ASSERT_EQ(in[k], static_cast<float>(rank + 1) + static_cast<float>(k % 7)) << c.name << ": input changed";
        }
        pg.barrier()->wait();  // nobody refills a buffer a peer may still read
      }
    });
  }
}

TEST_P(SharedBuffers, OutOfPlaceAllreduceRefusesOverlapAndMismatchedLengths) {
  ThreadWorld world(1, GetParam());
  world.run([&](int, ProcessGroup& pg) {
    std::vector<float> v(100);
    EXPECT_THROW(pg.allreduce(ConstBuffer{v.data(), 50, DType::f32}, Buffer{v.data() + 10, 50, DType::f32}), InvalidArgument);
    EXPECT_THROW(pg.allreduce(ConstBuffer{v.data(), 50, DType::f32}, Buffer{v.data() + 50, 40, DType::f32}), InvalidArgument);
    EXPECT_THROW(pg.allreduce(ConstBuffer{v.data(), 50, DType::f32}, Buffer{v.data() + 50, 50, DType::i32}), InvalidArgument);
    pg.allreduce(ConstBuffer{v.data(), 50, DType::f32}, Buffer{v.data(), 50, DType::f32})->wait();  // in place is fine
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, SharedBuffers, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lockstep
