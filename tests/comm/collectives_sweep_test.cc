// The full collective sweep on thread ranks: world sizes 1-8 x counts
// {0, 1, 7, 1000, 1048579} x every dtype x every op, for allreduce, reduce,
// broadcast, allgather and reduce_scatter, each checked element by element.
// One test per (backend, collective, world size). The same for the block
// collectives (gather, scatter, all_to_all with equal and per-rank counts,
// allgather with per-rank counts) and for premul_sum. hier runs on pretend
// hosts (hier_layouts()).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "block_cases.h"
#include "collective_cases.h"
#include "harness/thread_world.h"

namespace lockstep {
namespace {

using testing::BlockCase;
using testing::kAllBlockCases;
using testing::kSweepCounts;
using testing::run_block_case;
using testing::run_premul_case;
using testing::run_collective_case;
using testing::ThreadWorld;

// hier runs on pretend hosts (GroupOptions::host_id): these layouts give
// ranks per host. Two hosts of two, two of one (no shared memory), three
// uneven hosts (the flat fallback), and 2+2 interleaved (ranks 0 and 2 on
// one host) and 3x2 shuffled, so hosts need not hold consecutive ranks.
struct HierLayout {
  const char* name;
  std::vector<std::string> hosts;
};
const std::vector<HierLayout>& hier_layouts() {
  static const std::vector<HierLayout> layouts = {
      {"2x2", testing::pretend_hosts({2, 2})},
      {"2x1", testing::pretend_hosts({1, 1})},
      {"1p2p2", testing::pretend_hosts({1, 2, 2})},
      {"2x2interleaved", {"host0", "host1", "host0", "host1"}},
      {"2x3", testing::pretend_hosts({3, 3})},
      // Three hosts whose ranks of local rank 1 do not come in host order.
      {"3x2shuffled", {"host0", "host1", "host2", "host1", "host0", "host2"}},
  };
  return layouts;
}

struct SweepParam {
  std::string backend;
  Collective collective;
  int world_size;
  std::vector<std::string> hosts;  // hier: each rank's pretend host
  std::string layout;              // hier: the layout's name
};

void PrintTo(const SweepParam& p, std::ostream* os) {
  *os << p.backend << " " << p.collective << " over " << p.world_size << " ranks";
  if (!p.layout.empty()) *os << " on hosts " << p.layout;
}

std::string param_name(std::string_view backend, std::string_view what, int world_size, const std::string& layout) {
  if (!layout.empty()) return fmt::format("{}_{}_{}", backend, what, layout);
  return fmt::format("{}_{}_{}ranks", backend, what, world_size);
}

bool takes_op(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce || c == Collective::reduce_scatter;
}
bool takes_root(Collective c) { return c == Collective::reduce || c == Collective::broadcast; }

class CollectiveSweep : public ::testing::TestWithParam<SweepParam> {};

// Variants of the shm backend, each set by its variable for the group's
// set-up: "shm-streaming" writes its slots with streaming stores always
// (handoff_copy.h), as it does on its own while peers are far; "shm-slots"
// takes the slots where it could read peers' memory (a broadcast's single
// copy off); "shm-single-copy" moves ordinary buffers of all-reduces and
// broadcasts by cross-memory attach always, "shm-slots-ordinary" never (by
// default each takes the way it measures cheaper).
const std::map<std::string, std::pair<const char*, const char*>>& shm_variants() {
  static const std::map<std::string, std::pair<const char*, const char*>> variants = {
      {"shm-streaming", {"LOCKSTEP_SHM_STREAMING_STORES", "always"}},
      {"shm-slots", {"LOCKSTEP_SHM_SINGLE_COPY_BYTES", "0"}},
      {"shm-single-copy", {"LOCKSTEP_SHM_ORDINARY_PATH", "single-copy"}},
      {"shm-slots-ordinary", {"LOCKSTEP_SHM_ORDINARY_PATH", "slots"}},
  };
  return variants;
}

TEST_P(CollectiveSweep, EveryCountDTypeAndOp) {
  const auto& p = GetParam();
  const auto variant = shm_variants().find(p.backend);
  const bool shm_variant = variant != shm_variants().end();
  if (shm_variant) ::setenv(variant->second.first, variant->second.second, 1);
  ThreadWorld world(p.world_size, shm_variant ? "shm" : p.backend, std::chrono::seconds(60), {}, p.hosts);
  if (shm_variant) ::unsetenv(variant->second.first);
  if (!p.hosts.empty()) ASSERT_EQ(world.group(0).backend(), "hier");
  std::mutex mutex;
  std::vector<std::string> failures;
  int cases = 0;
  for (std::size_t count : kSweepCounts) {
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!takes_op(p.collective) && op != ReduceOp::sum) continue;
        // Vary the root across cases so every rank serves as root somewhere.
        const int root = takes_root(p.collective) ? (cases % p.world_size) : 0;
        ++cases;
        world.run([&](int, ProcessGroup& pg) {
          std::string failure = run_collective_case(pg, p.collective, count, dtype, op, root);
          if (!failure.empty()) {
            std::lock_guard lock(mutex);
            failures.push_back(std::move(failure));
          }
        });
      }
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures; first: " << failures.front();
}

std::vector<SweepParam> all_params() {
  std::vector<SweepParam> out;
  for (const char* backend : {"tcp", "shm"})
    for (Collective c : {Collective::allreduce, Collective::reduce, Collective::broadcast, Collective::allgather,
                         Collective::reduce_scatter})
      for (int n = 1; n <= 8; ++n) out.push_back({backend, c, n, {}, {}});
  for (Collective c : {Collective::allreduce, Collective::reduce, Collective::broadcast, Collective::allgather,
                       Collective::reduce_scatter})
    for (int n : {2, 3, 5}) out.push_back({"shm-streaming", c, n, {}, {}});
  for (int n : {2, 3, 5}) {
    out.push_back({"shm-slots", Collective::broadcast, n, {}, {}});
    out.push_back({"shm-single-copy", Collective::allreduce, n, {}, {}});
    out.push_back({"shm-single-copy", Collective::broadcast, n, {}, {}});
  }
  for (int n : {3, 5, 8}) {
    out.push_back({"shm-slots-ordinary", Collective::allreduce, n, {}, {}});
    out.push_back({"shm-slots-ordinary", Collective::broadcast, n, {}, {}});
  }
  for (const auto& layout : hier_layouts())
    for (Collective c : {Collective::allreduce, Collective::reduce, Collective::broadcast, Collective::allgather,
                         Collective::reduce_scatter})
      out.push_back({"hier", c, static_cast<int>(layout.hosts.size()), layout.hosts, layout.name});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CollectiveSweep, ::testing::ValuesIn(all_params()), [](const auto& info) {
  std::string backend = info.param.backend;
  std::replace(backend.begin(), backend.end(), '-', '_');
  return param_name(backend, to_string(info.param.collective), info.param.world_size, info.param.layout);
});

struct BlockParam {
  std::string backend;
  BlockCase block_case;
  int world_size;
  std::vector<std::string> hosts;  // hier: each rank's pretend host
  std::string layout;
};

void PrintTo(const BlockParam& p, std::ostream* os) {
  *os << p.backend << " " << to_string(p.block_case) << " over " << p.world_size << " ranks";
}

class BlockSweep : public ::testing::TestWithParam<BlockParam> {};

// "shm-slots": the shm backend with single copy off, so large blocks take
// the shared slots as where ranks may not read each other's memory;
// "shm-slots-streaming": the same with streaming stores into the slots.
TEST_P(BlockSweep, EveryCountAndDType) {
  const auto& p = GetParam();
  const bool slots = p.backend == "shm-slots" || p.backend == "shm-slots-streaming";
  const bool streaming = p.backend == "shm-slots-streaming";
  if (slots) ::setenv("LOCKSTEP_SHM_SINGLE_COPY_BYTES", "0", 1);
  if (streaming) ::setenv("LOCKSTEP_SHM_STREAMING_STORES", "always", 1);
  ThreadWorld world(p.world_size, slots ? "shm" : p.backend, std::chrono::seconds(60), {}, p.hosts);
  if (!p.hosts.empty()) ASSERT_EQ(world.group(0).backend(), "hier");
  if (slots) ::unsetenv("LOCKSTEP_SHM_SINGLE_COPY_BYTES");
  if (streaming) ::unsetenv("LOCKSTEP_SHM_STREAMING_STORES");
  std::mutex mutex;
  std::vector<std::string> failures;
  int cases = 0;
  for (std::size_t count : kSweepCounts) {
    for (DType dtype : kAllDTypes) {
      const int root = cases++ % p.world_size;  // every rank serves as root somewhere
      world.run([&](int, ProcessGroup& pg) {
        std::string failure = run_block_case(pg, p.block_case, count, dtype, root);
        if (!failure.empty()) {
          std::lock_guard lock(mutex);
          failures.push_back(std::move(failure));
        }
      });
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures; first: " << failures.front();
}

std::vector<BlockParam> block_params() {
  std::vector<BlockParam> out;
  for (const char* backend : {"tcp", "shm", "shm-slots"})
    for (BlockCase c : kAllBlockCases)
      for (int n = 1; n <= 8; ++n) out.push_back({backend, c, n, {}, {}});
  for (BlockCase c : kAllBlockCases)
    for (int n : {2, 3}) out.push_back({"shm-slots-streaming", c, n, {}, {}});
  for (const auto& layout : hier_layouts())
    for (BlockCase c : kAllBlockCases)
      out.push_back({"hier", c, static_cast<int>(layout.hosts.size()), layout.hosts, layout.name});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, BlockSweep, ::testing::ValuesIn(block_params()), [](const auto& info) {
  std::string backend = info.param.backend;
  std::replace(backend.begin(), backend.end(), '-', '_');
  return param_name(backend,
                    to_string(info.param.block_case), info.param.world_size, info.param.layout);
});

class PremulSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(PremulSweep, EveryCountAndFloatingDType) {
  const auto& p = GetParam();
  ThreadWorld world(p.world_size, p.backend, std::chrono::seconds(60), {}, p.hosts);
  if (!p.hosts.empty()) ASSERT_EQ(world.group(0).backend(), "hier");
  std::mutex mutex;
  std::vector<std::string> failures;
  int cases = 0;
  for (std::size_t count : kSweepCounts) {
    for (DType dtype : kAllDTypes) {
      if (!is_floating(dtype)) continue;
      const int root = cases++ % p.world_size;
      world.run([&](int, ProcessGroup& pg) {
        std::string failure = run_premul_case(pg, p.collective, count, dtype, root);
        if (!failure.empty()) {
          std::lock_guard lock(mutex);
          failures.push_back(std::move(failure));
        }
      });
    }
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures; first: " << failures.front();
}

std::vector<SweepParam> premul_params() {
  std::vector<SweepParam> out;
  for (const char* backend : {"tcp", "shm"})
    for (Collective c : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter})
      for (int n : {1, 2, 3, 5, 8}) out.push_back({backend, c, n, {}, {}});
  for (const auto& layout : hier_layouts())
    for (Collective c : {Collective::allreduce, Collective::reduce, Collective::reduce_scatter})
      out.push_back({"hier", c, static_cast<int>(layout.hosts.size()), layout.hosts, layout.name});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Sweep, PremulSweep, ::testing::ValuesIn(premul_params()), [](const auto& info) {
  return param_name(info.param.backend, to_string(info.param.collective), info.param.world_size, info.param.layout);
});

}  // namespace
}  // namespace lockstep
