// The nccl backend on a GPU, in a world of one (NCCL runs one rank per GPU,
// and one GPU is what a test machine has): every collective, in and out of
// place, every dtype and reduction the backend says it supports, on CUDA
// memory and on host memory (the backend's copy through device scratch),
// against a reference computed here. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "comm/reference.h"
#include "harness/bare_config.h"
#include "harness/thread_world.h"
#include "lockstep/config.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using testing::compare_elements;
using testing::make_input;

constexpr std::size_t kCounts[] = {1, 1023};

// Device memory of cuda:0 holding a copy of host bytes; freed at scope end.
class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  explicit DeviceBytes(const std::vector<std::byte>& host) : DeviceBytes(host.size()) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(data_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  std::vector<std::byte> to_host() const {
    std::vector<std::byte> host(bytes_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  Buffer view(std::size_t count, DType dtype) const { return Buffer{data_, count, dtype, Device::cuda(0), nullptr}; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class NcclOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    const cudaError_t status = cudaGetDeviceCount(&devices);
    if (status != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no CUDA device (" << cudaGetErrorString(status) << "): the nccl backend needs a GPU";
    GroupOptions options;
    options.config = testing::bare_config();
    options.rank = 0;
    options.world_size = 1;
    options.backend = "nccl";
    options.store = std::make_shared<HashStore>();
    pg_ = init_process_group(options);
    ASSERT_EQ(pg_->backend(), "nccl");
  }

  std::shared_ptr<ProcessGroup> pg_;
};

// The expected result of reducing `count` elements over the world (of one).
std::vector<std::byte> expected_reduction(std::size_t count, DType dtype, ReduceOp op) {
  return testing::expected_results(dtype, count, 0, 1, op);
}

TEST_F(NcclOnGpu, AllreduceInPlaceAndOutOfPlaceEveryDtypeAndOp) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!pg_->supports(Collective::allreduce, dtype, op)) continue;
      for (std::size_t count : kCounts) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << op << " x " << count);
        const auto input = make_input(0, count, dtype, op);
        const auto want = expected_reduction(count, dtype, op);
        DeviceBytes in_place(input);
        pg_->allreduce(in_place.view(count, dtype), op)->synchronize();
        EXPECT_EQ(compare_elements(in_place.to_host().data(), want.data(), count, dtype), "");
        DeviceBytes source(input);
        DeviceBytes result(input.size());
        pg_->allreduce(source.view(count, dtype), result.view(count, dtype), op)->synchronize();
        EXPECT_EQ(compare_elements(result.to_host().data(), want.data(), count, dtype), "");
        EXPECT_EQ(compare_elements(source.to_host().data(), input.data(), count, dtype), "") << "input changed";
      }
    }
  }
}

TEST_F(NcclOnGpu, ReduceAndReduceScatterEveryDtypeAndOp) {
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (std::size_t count : kCounts) {
        SCOPED_TRACE(::testing::Message() << dtype << " " << op << " x " << count);
        const auto input = make_input(0, count, dtype, op);
        const auto want = expected_reduction(count, dtype, op);
        if (pg_->supports(Collective::reduce, dtype, op)) {
          DeviceBytes data(input);
          pg_->reduce(data.view(count, dtype), 0, op)->synchronize();
          EXPECT_EQ(compare_elements(data.to_host().data(), want.data(), count, dtype), "");
        }
        if (pg_->supports(Collective::reduce_scatter, dtype, op)) {
          DeviceBytes source(input);
          DeviceBytes result(input.size());
          pg_->reduce_scatter(source.view(count, dtype), result.view(count, dtype), op)->synchronize();
          EXPECT_EQ(compare_elements(result.to_host().data(), want.data(), count, dtype), "");
        }
      }
    }
  }
}

// The collectives that move data without reducing it: in a world of one each
// leaves the output equal to the input.
TEST_F(NcclOnGpu, DataMovementEveryDtype) {
  for (DType dtype : kAllDTypes) {
    for (std::size_t count : kCounts) {
      SCOPED_TRACE(::testing::Message() << dtype << " x " << count);
      const auto input = make_input(0, count, dtype, ReduceOp::sum);
      const auto check_copy = [&](const char* what, auto run) {
        DeviceBytes source(input);
        DeviceBytes result(input.size());
        run(source.view(count, dtype), result.view(count, dtype));
        EXPECT_EQ(compare_elements(result.to_host().data(), input.data(), count, dtype), "") << what;
      };
      check_copy("allgather", [&](Buffer in, Buffer out) { pg_->allgather(in, out)->synchronize(); });
      check_copy("allgather_v", [&](Buffer in, Buffer out) { pg_->allgather(in, out, {count})->synchronize(); });
      check_copy("gather", [&](Buffer in, Buffer out) { pg_->gather(in, out, 0)->synchronize(); });
      check_copy("scatter", [&](Buffer in, Buffer out) { pg_->scatter(in, out, 0)->synchronize(); });
      check_copy("all_to_all", [&](Buffer in, Buffer out) { pg_->all_to_all(in, out)->synchronize(); });
      check_copy("all_to_all with counts",
                 [&](Buffer in, Buffer out) { pg_->all_to_all(in, {count}, out, {count})->synchronize(); });
      DeviceBytes data(input);
      pg_->broadcast(data.view(count, dtype), 0)->synchronize();
      EXPECT_EQ(compare_elements(data.to_host().data(), input.data(), count, dtype), "") << "broadcast";
    }
  }
}

// A barrier is an operation of its own, numbered after the ones issued
// before it: once it is done, they are done (the group runs operations one
// at a time, in issue order), without an error and without aborting.
TEST_F(NcclOnGpu, BarrierCompletesAfterTheOperationsIssuedBeforeIt) {
  constexpr std::size_t kCount = 1023;
  const auto input = make_input(0, kCount, DType::f32, ReduceOp::sum);
  DeviceBytes data(input);
  auto reduction = pg_->allreduce(data.view(kCount, DType::f32), ReduceOp::sum);
  auto first = pg_->barrier();
  auto second = pg_->barrier();
  second->wait();
  EXPECT_TRUE(first->done());
  EXPECT_TRUE(reduction->done()) << "a barrier finished before the allreduce issued ahead of it";
  EXPECT_FALSE(first->error());
  EXPECT_FALSE(second->error());
  EXPECT_EQ(first->info().collective, Collective::barrier);
  EXPECT_LT(reduction->seq(), first->seq());
  EXPECT_LT(first->seq(), second->seq());
  reduction->synchronize();
  EXPECT_EQ(compare_elements(data.to_host().data(), expected_reduction(kCount, DType::f32, ReduceOp::sum).data(),
                             kCount, DType::f32),
            "");
  EXPECT_FALSE(pg_->aborted());
}

// Host memory goes through the backend's device scratch.
TEST_F(NcclOnGpu, HostMemoryIsCopiedThroughTheDevice) {
  std::vector<float> data(1000);
  std::iota(data.begin(), data.end(), 1.0f);
  const std::vector<float> want = data;
  pg_->allreduce(view(std::span(data)), ReduceOp::max)->wait();
  EXPECT_EQ(data, want);
  std::vector<std::int32_t> in{1, 2, 3};
  std::vector<std::int32_t> out(3, 0);
  pg_->allgather(const_view(std::span<const std::int32_t>(in)), view(std::span(out)))->wait();
  EXPECT_EQ(out, in);
}

TEST_F(NcclOnGpu, MemoryOfAnotherDeviceIsRefusedNamingBothDevices) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices < 2) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  void* other = nullptr;
  ASSERT_EQ(cudaMalloc(&other, sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  try {
    pg_->allreduce(Buffer{other, 1, DType::f32, Device::cuda(1), nullptr})->wait();
    ADD_FAILURE() << "an allreduce on cuda:1 memory ran on a backend bound to cuda:0";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuda:1"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:0"), std::string::npos) << message;
  }
  cudaFree(other);
}

// NCCL has no receive from any source: recv_any is refused as it is issued
// (on CUDA and on host memory), saying why and what to use instead, and the
// group goes on.
TEST_F(NcclOnGpu, RecvFromAnySourceIsRefusedNamingTheCauseAndTheGroupGoesOn) {
  DeviceBytes device(4 * sizeof(float));
  std::vector<float> host(4);
  for (const Buffer& data : {device.view(4, DType::f32), view(std::span(host))}) {
    try {
      pg_->recv_any(data);
      ADD_FAILURE() << "recv_any was accepted on " << to_string(data.device);
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("nccl backend cannot receive from any source"), std::string::npos) << message;
      EXPECT_NE(message.find("Name the source"), std::string::npos) << message;
    }
  }
  EXPECT_FALSE(pg_->aborted());
  pg_->barrier()->wait();
}

// NCCL runs one rank per GPU: two ranks on the one device of this machine
// are refused at group creation with a ConfigError that says so, on every
// rank that gets that far, and nothing hangs.
TEST(NcclOnOneGpu, TwoRanksAreAConfigErrorSayingOneGpuPerRank) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<HashStore>();
  const auto errors = testing::run_threads(2, [&](int rank) {
    GroupOptions options;
    options.config = testing::bare_config();  // local rank 0 for both: both choose cuda:0
    options.rank = rank;
    options.world_size = 2;
    options.backend = "nccl";
    options.store = store;
    options.connect_timeout = std::chrono::seconds(30);
    init_process_group(options);
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[static_cast<std::size_t>(rank)]) << "rank " << rank << " formed an nccl group on a shared GPU";
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(rank)]);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("one GPU per rank"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": not a ConfigError: " << e.what();
    }
  }
}

}  // namespace
}  // namespace lockstep
