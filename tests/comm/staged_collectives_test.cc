// CUDA memory through the staging backends (label gpu): 2 and 4 thread
// ranks sharing one GPU over shm and tcp, every collective on device
// buffers, with a staging chunk small enough that the counts are not
// multiples of it, each rank's buffers ordered by its own stream
// (cuda_placement.h). Then the stream contract on its own, and a rank that
// dies in a device collective. Every test skips where this process sees no
// CUDA device.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>

#include "comm/block_cases.h"
#include "comm/collective_cases.h"
#include "comm/cuda_placement.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "harness/thread_world.h"

namespace lockstep {
namespace {

using testing::CudaPlacement;
using testing::ThreadWorld;

#define SKIP_WITHOUT_CUDA()                                                        \
  do {                                                                             \
    std::string why;                                                               \
    if (!testing::cuda_device_present(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

// A stream per rank, so every rank orders its own work, as a training process does.
class RankStreams {
 public:
  explicit RankStreams(int n) : streams_(static_cast<std::size_t>(n)) {
    for (auto& s : streams_) cudaStreamCreate(&s);
  }
  ~RankStreams() {
    for (auto s : streams_) cudaStreamDestroy(s);
  }
  cudaStream_t operator[](int rank) const { return streams_[static_cast<std::size_t>(rank)]; }

 private:
  std::vector<cudaStream_t> streams_;
};

// A chunk of 1000 bytes: no count below is a multiple of a chunk of any dtype.
GroupOptions small_chunks() {
  Config config;
  config.cuda_staging_chunk_bytes = 1000;
  GroupOptions options;
  options.config = config;
  return options;
}

struct StagedParam {
  std::string backend;
  int world_size;
};

void PrintTo(const StagedParam& p, std::ostream* os) { *os << p.backend << " over " << p.world_size << " ranks"; }

class StagedSweep : public ::testing::TestWithParam<StagedParam> {};

TEST_P(StagedSweep, EveryCollectiveOnDeviceBuffers) {
  SKIP_WITHOUT_CUDA();
  const auto& p = GetParam();
  ThreadWorld world(p.world_size, p.backend, std::chrono::seconds(60), small_chunks());
  RankStreams streams(p.world_size);
  const Collective reductions[] = {Collective::allreduce, Collective::reduce, Collective::broadcast,
                                   Collective::allgather, Collective::reduce_scatter};
  world.run([&](int rank, ProcessGroup& pg) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, std::size_t{300007}})
      for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i64})
        for (Collective c : reductions)
          for (ReduceOp op : kAllReduceOps) {
            if (c != Collective::allreduce && op != ReduceOp::sum) continue;
            const std::string failure = testing::run_collective_case(
                pg, c, count, dtype, op, static_cast<int>(count % static_cast<std::size_t>(pg.size())),
                CudaPlacement(0, streams[rank]));
            if (!failure.empty()) throw Error(failure);
          }
    for (testing::BlockCase c : testing::kAllBlockCases)
      for (std::size_t count : {std::size_t{1}, std::size_t{4099}}) {
        const std::string failure =
            testing::run_block_case(pg, c, count, DType::f32, 0, CudaPlacement(0, streams[rank]));
        if (!failure.empty()) throw Error(failure);
      }
  });
}

INSTANTIATE_TEST_SUITE_P(Staged, StagedSweep,
                         ::testing::Values(StagedParam{"shm", 2}, StagedParam{"shm", 4}, StagedParam{"tcp", 2},
                                           StagedParam{"tcp", 4}),
                         [](const auto& info) {
                           return info.param.backend + "_" + std::to_string(info.param.world_size) + "ranks";
                         });

// Point to point on device buffers, both ways.
TEST(StagedDevice, SendAndRecv) {
  SKIP_WITHOUT_CUDA();
  ThreadWorld world(2, "shm", std::chrono::seconds(60), small_chunks());
  RankStreams streams(2);
  world.run([&](int rank, ProcessGroup& pg) {
    std::vector<std::byte> data = testing::make_input(rank, 4099, DType::f32, ReduceOp::sum);
    CudaPlacement at(0, streams[rank]);
    if (rank == 0) at.finish(*pg.send(at.place_input(data, 4099, DType::f32), 1, 7));
    else at.finish(*pg.recv(at.place(data, 4099, DType::f32), 0, 7));
    const auto want = testing::make_input(0, 4099, DType::f32, ReduceOp::sum);
    const std::string diff = testing::compare_elements(data.data(), want.data(), 4099, DType::f32);
    if (!diff.empty()) throw Error(diff);
  });
}

// Work::synchronize() leaves the result readable from the host at once,
// with no stream of the caller's involved.
TEST(StagedDevice, SynchronizeBlocksTheHostUntilTheResultIsThere) {
  SKIP_WITHOUT_CUDA();
  ThreadWorld world(2, "shm");
  world.run([&](int rank, ProcessGroup& pg) {
    const std::size_t n = 1 << 20;
    std::vector<float> host(n, static_cast<float>(rank + 1));
    void* memory = nullptr;
    cudaMalloc(&memory, n * sizeof(float));
    auto* device = static_cast<float*>(memory);
    cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    pg.allreduce(Buffer{device, n, DType::f32, Device::cuda(0), nullptr})->synchronize();
    cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(device);
    for (std::size_t i = 0; i < n; i += 4099)
      if (host[i] != 3.0f) throw Error(fmt::format("element {} is {}, not 3", i, host[i]));
  });
}

// A rank killed while the others are in a device collective: they raise
// within the timeout, and nothing hangs. Processes, not threads; the parent
// never touches CUDA (a forked child cannot use a CUDA the parent started).
TEST(StagedDevice, RankKilledInADeviceCollectiveIsNamedWithinTheTimeout) {
  if (access("/dev/nvidiactl", F_OK) != 0) GTEST_SKIP() << "no CUDA device: /dev/nvidiactl is missing";
  const int n = 3;
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  testing::ProcessRanks ranks(
      n,
      [&](int rank) {
        return testing::EnvMap{{"RANK", std::to_string(rank)},   {"WORLD_SIZE", std::to_string(n)},
                               {"MASTER_ADDR", "127.0.0.1"},     {"MASTER_PORT", std::to_string(port)},
                               {"LOCKSTEP_BACKEND", "tcp"},      {"LOCKSTEP_TIMEOUT", "10"},
                               {"LOCKSTEP_CONNECT_TIMEOUT", "30"}};
      },
      [&](int rank) {
        auto pg = init_process_group();
        const std::size_t count = 1 << 22;
        void* device = nullptr;
        if (cudaMalloc(&device, count * sizeof(float)) != cudaSuccess) throw Error("cudaMalloc failed");
        pg->allreduce(Buffer{device, count, DType::f32, Device::cuda(0), nullptr})->synchronize();
        if (rank == n - 1) std::raise(SIGKILL);
        for (int i = 0; i < 1000; ++i)
          pg->allreduce(Buffer{device, count, DType::f32, Device::cuda(0), nullptr})->synchronize();
      });
  const auto results = ranks.wait_all(std::chrono::seconds(60));
  for (const auto& r : results) {
    if (r.rank == n - 1) continue;
    EXPECT_FALSE(r.hit_deadline) << describe(r);
    EXPECT_TRUE(r.exit_code == testing::kExitPeerError || r.exit_code == testing::kExitTimeoutError) << describe(r);
  }
}

}  // namespace
}  // namespace lockstep
