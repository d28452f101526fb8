// The collectives over logical shards (src/comm/shard_reduction.cc,
// shard_gather_scatter.cc): over shm, tcp and hier, at 1-4 ranks, for
// shard maps where each rank holds its own shard, where the shards go round
// a smaller group, where one rank holds them all, where they are handed out
// backwards, and where a lost rank's shard went to the next rank:
// reduce_shards' output and each block of reduce_scatter_shards' equal, bit
// for bit, one reduce_many over the shards in shard order (the fold a full
// job's shm all-reduce and reduce_scatter compute, so that a job that lost
// ranks and shares their shards out reduces to the same bits), and
// allgather_shards lays every shard's block in shard order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/reduce_kernels.h"
#include "comm/shard_map.h"
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

// Maps where every rank holds a shard, as reduce_scatter_shards needs: those
// above but "one", and a job of n + 1 whose rank 1 died (or rank 0, for
// n = 1), its shard taken over by the rank after it, which kept its copy.
std::vector<ShardMap> maps_without_idle_ranks(int n) {
  std::vector<ShardMap> maps;
  for (ShardMap& map : shard_maps(n))
    if (map.name != "one") maps.push_back(std::move(map));
  std::vector<int> taken_over;
  for (int s = 0; s <= n; ++s) taken_over.push_back(s <= 1 ? std::min(s, n - 1) : s - 1);
  maps.push_back({"taken_over", taken_over});
  return maps;
}

std::vector<std::byte> block_of(const std::vector<std::byte>& whole, int b, std::size_t block, DType dtype) {
  const std::size_t bytes = block * dtype_size(dtype);
  return {whole.begin() + static_cast<std::ptrdiff_t>(b * bytes),
          whole.begin() + static_cast<std::ptrdiff_t>((b + 1) * bytes)};
}

using BackendAndRanks = std::tuple<std::string, int>;

std::vector<BackendAndRanks> backends_and_ranks() {
  return {{"shm", 1}, {"shm", 2}, {"shm", 3}, {"shm", 4}, {"tcp", 2}, {"tcp", 3}, {"hier2", 4}};
}

std::string backend_and_ranks_name(const ::testing::TestParamInfo<BackendAndRanks>& info) {
  return fmt::format("{}_{}ranks", std::get<0>(info.param), std::get<1>(info.param));
}

class ShardReduction : public ::testing::TestWithParam<BackendAndRanks> {};

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
                         ::testing::ValuesIn(backends_and_ranks()), backend_and_ranks_name);

class ShardScatter : public ::testing::TestWithParam<BackendAndRanks> {};

TEST_P(ShardScatter, EachBlockEqualsOneFoldInShardOrderWhoeverHoldsTheShards) {
  const auto& [backend, n] = GetParam();
  ThreadWorld world(n, backend);
  std::mutex mutex;
  std::vector<std::string> failures;
  for (const ShardMap& map : maps_without_idle_ranks(n)) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{25001}}) {
      for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32}) {
        for (ReduceOp op : {ReduceOp::avg, ReduceOp::sum, ReduceOp::max}) {
          if (dtype == DType::i32 && op == ReduceOp::avg) continue;
          const int shards = static_cast<int>(map.holder.size());
          const std::vector<std::byte> want = reference(shards, block * static_cast<std::size_t>(shards), dtype, op);
          world.run([&](int rank, ProcessGroup& pg) {
            std::vector<std::vector<std::byte>> inputs, got;
            std::vector<ConstBuffer> held;
            std::vector<Buffer> outputs;
            const std::vector<int> mine = shards_held(map.holder, rank);
            for (int s : mine) inputs.push_back(shard_data(s, block * static_cast<std::size_t>(shards), dtype));
            for (const auto& d : inputs) held.push_back(ConstBuffer{d.data(), block * static_cast<std::size_t>(shards), dtype});
            got.assign(mine.size(), std::vector<std::byte>(block * dtype_size(dtype), std::byte{0x5a}));
            for (auto& g : got) outputs.push_back(Buffer{g.data(), block, dtype});
            pg.reduce_scatter_shards(held, map.holder, outputs, op)->wait();
            for (std::size_t j = 0; j < mine.size(); ++j)
              if (got[j] != block_of(want, mine[j], block, dtype)) {
                std::lock_guard lock(mutex);
                failures.push_back(fmt::format("{} map, blocks of {} x {}, {}: rank {}'s block {} differs from the "
                                               "fold in shard order",
                                               map.name, block, to_string(dtype), to_string(op), rank, mine[j]));
              }
          });
        }
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures; first: " << failures.front();
}

TEST_P(ShardScatter, AllgatherLaysEveryShardsBlockInShardOrder) {
  const auto& [backend, n] = GetParam();
  ThreadWorld world(n, backend);
  std::mutex mutex;
  std::vector<std::string> failures;
  std::vector<ShardMap> maps = shard_maps(n);
  for (ShardMap& map : maps_without_idle_ranks(n))
    if (map.name == "taken_over") maps.push_back(std::move(map));
  for (const ShardMap& map : maps) {
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{25001}}) {
      const int shards = static_cast<int>(map.holder.size());
      std::vector<std::byte> want;
      for (int s = 0; s < shards; ++s) {
        const auto data = shard_data(s, block, DType::f32);
        want.insert(want.end(), data.begin(), data.end());
      }
      world.run([&](int rank, ProcessGroup& pg) {
        std::vector<std::vector<std::byte>> blocks;
        std::vector<ConstBuffer> held;
        for (int s : shards_held(map.holder, rank)) blocks.push_back(shard_data(s, block, DType::f32));
        for (const auto& d : blocks) held.push_back(ConstBuffer{d.data(), block, DType::f32});
        std::vector<std::byte> got(want.size(), std::byte{0x5a});
        pg.allgather_shards(held, map.holder, Buffer{got.data(), block * static_cast<std::size_t>(shards), DType::f32})
            ->wait();
        if (got != want) {
          std::lock_guard lock(mutex);
          failures.push_back(fmt::format("{} map, blocks of {}: rank {}'s output is not the blocks in shard order",
                                         map.name, block, rank));
        }
      });
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures; first: " << failures.front();
}

INSTANTIATE_TEST_SUITE_P(Backends, ShardScatter,
                         ::testing::ValuesIn(backends_and_ranks()), backend_and_ranks_name);

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
    const ConstBuffer whole{a.data(), 4, DType::f32};
    const Buffer half{out.data(), 2, DType::f32};
    // A rank without a shard, a block for a shard it does not hold, inputs
    // that are not a block per shard, an output not one.
    EXPECT_THROW(pg.reduce_scatter_shards({}, {1, 1}, {}), InvalidArgument);
    EXPECT_THROW(pg.reduce_scatter_shards({whole}, {0, 1}, {half, half}), InvalidArgument);
    EXPECT_THROW(pg.reduce_scatter_shards({ConstBuffer{a.data(), 3, DType::f32}}, {0, 1}, {half}), InvalidArgument);
    EXPECT_THROW(pg.allgather_shards({ConstBuffer{a.data(), 1, DType::f32}}, {0, 1}, Buffer{out.data(), 3, DType::f32}),
                 InvalidArgument);
    EXPECT_THROW(pg.allgather_shards({whole, whole}, {0, 1}, Buffer{out.data(), 8, DType::f32}), InvalidArgument);
    (void)rank;
  });
}

}  // namespace
}  // namespace lockstep
