// ProcessGroup::reduce_shards (src/comm/shard_reduction.cc): over shm, tcp
// and hier, at 1-4 ranks, for shard maps where each rank holds its own
// shard, where the shards go round a smaller group, where one rank holds
// them all, and where they are handed out backwards, every rank's output
// equals, bit for bit, one reduce_many over the shards in shard order: the
// fold a full job's shm all-reduce computes, so that a job that lost ranks
// and shares their shards out reduces to the same bits.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/reduce_kernels.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

using testing::ThreadWorld;

// Shard s's element i, as bytes of `dtype`: values whose sums round
// differently in another order.
std::vector<std::byte> shard_data(int s, std::size_t count, DType dtype) {
  std::vector<std::byte> out(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const double v = 1.0 / static_cast<double>(3 + s + 7 * static_cast<int>(i % 101)) * (i % 2 == 0 ? 1 : -1);
    switch (dtype) {
      case DType::f32: {
        const float f = static_cast<float>(v);
        std::memcpy(out.data() + i * 4, &f, 4);
        break;
      }
      case DType::f64: std::memcpy(out.data() + i * 8, &v, 8); break;
      case DType::i32: {
        const std::int32_t x = static_cast<std::int32_t>(i % 1000) * (s + 1) - 77 * s;
        std::memcpy(out.data() + i * 4, &x, 4);
        break;
      }
      default: {  // f16, bf16: the top bits of the float
        float f = static_cast<float>(v);
        std::uint32_t bits = 0;
        std::memcpy(&bits, &f, 4);
        const auto half = static_cast<std::uint16_t>(dtype == DType::bf16 ? bits >> 16 : (0x3c00 + (i + s) % 1000));
        std::memcpy(out.data() + i * 2, &half, 2);
      }
    }
  }
  return out;
}

std::vector<std::byte> reference(int shards, std::size_t count, DType dtype, ReduceOp op) {
  std::vector<std::vector<std::byte>> data;
  std::vector<const void*> sources;
  for (int s = 0; s < shards; ++s) data.push_back(shard_data(s, count, dtype));
  for (const auto& d : data) sources.push_back(d.data());
  std::vector<std::byte> out(count * dtype_size(dtype));
  if (count > 0) reduce_many(out.data(), sources.data(), shards, count, dtype, op);
  return out;
}

struct ShardMap {
  std::string name;
  std::vector<int> holder;
};

// Shard maps over a group of n ranks.
std::vector<ShardMap> shard_maps(int n) {
  std::vector<ShardMap> maps;
  std::vector<int> own, round, one, backwards;
  for (int s = 0; s < n; ++s) own.push_back(s);
  maps.push_back({"own", own});
  for (int s = 0; s < n + 2; ++s) round.push_back(s % n);  // a job of n + 2 that lost two ranks
  maps.push_back({"round", round});
  for (int s = 0; s < 3; ++s) one.push_back(n - 1);
  maps.push_back({"one", one});
  for (int s = 0; s < 2 * n; ++s) backwards.push_back(n - 1 - s / 2);
  maps.push_back({"backwards", backwards});
  return maps;
}

class ShardReduction : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ShardReduction, EqualsOneFoldInShardOrderWhoeverHoldsTheShards) {
  const auto& [backend, n] = GetParam();
  ThreadWorld world(n, backend);
  std::mutex mutex;
  std::vector<std::string> failures;
  for (const ShardMap& map : shard_maps(n)) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{100003}}) {
      for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32}) {
        for (ReduceOp op : {ReduceOp::avg, ReduceOp::sum, ReduceOp::max}) {
          if (dtype == DType::i32 && op == ReduceOp::avg) continue;
          const int shards = static_cast<int>(map.holder.size());
          const std::vector<std::byte> want = reference(shards, count, dtype, op);
          world.run([&](int rank, ProcessGroup& pg) {
            std::vector<std::vector<std::byte>> mine;
            std::vector<ConstBuffer> held;
            for (int s = 0; s < shards; ++s)
              if (map.holder[static_cast<std::size_t>(s)] == rank) mine.push_back(shard_data(s, count, dtype));
            for (const auto& d : mine) held.push_back(ConstBuffer{d.data(), count, dtype});
            std::vector<std::byte> got(count * dtype_size(dtype), std::byte{0x5a});
            pg.reduce_shards(held, map.holder, Buffer{got.data(), count, dtype}, op)->wait();
            if (got != want) {
              std::lock_guard lock(mutex);
              failures.push_back(fmt::format("{} map, {} x {}, {}: rank {} differs from the fold in shard order",
                                             map.name, count, to_string(dtype), to_string(op), rank));
            }
          });
        }
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures; first: " << failures.front();
}

INSTANTIATE_TEST_SUITE_P(Backends, ShardReduction,
                         ::testing::Values(std::tuple{"shm", 1}, std::tuple{"shm", 2}, std::tuple{"shm", 3},
                                           std::tuple{"shm", 4}, std::tuple{"tcp", 2}, std::tuple{"tcp", 3},
                                           std::tuple{"hier2", 4}),
                         [](const auto& info) {
                           return fmt::format("{}_{}ranks", std::get<0>(info.param), std::get<1>(info.param));
                         });

// A map that does not give this rank as many shards as it passes, or a
// holder outside the group, is refused before anything is exchanged.
TEST(ShardReductionRefusals, AMapThatDoesNotFitIsAnInvalidArgument) {
  ThreadWorld world(2, "shm");
  world.run([](int rank, ProcessGroup& pg) {
    std::vector<float> a(4), out(4);
    EXPECT_THROW(pg.reduce_shards({ConstBuffer{a.data(), 4, DType::f32}}, {0, 0}, Buffer{out.data(), 4, DType::f32}),
                 InvalidArgument);
    EXPECT_THROW(pg.reduce_shards({}, {0, 2}, Buffer{out.data(), 4, DType::f32}), InvalidArgument);
    EXPECT_THROW(pg.reduce_shards({ConstBuffer{a.data(), 3, DType::f32}}, {0, 1}, Buffer{out.data(), 4, DType::f32}),
                 InvalidArgument);
    (void)rank;
  });
}

}  // namespace
}  // namespace lockstep
