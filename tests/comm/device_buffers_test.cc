// CUDA memory at the front end, where no GPU is needed: how buffers name
// their device, what the process group refuses before it touches any
// memory (mixed devices, two streams, premul_sum), what a process without
// CUDA says, and that the collective check tells host memory from CUDA
// memory across ranks. The device paths themselves: staged_collectives_test
// and nccl_gpu_test (label gpu).
#include <gtest/gtest.h>
#include <unistd.h>

#include "comm/device_memory.h"
#include "comm/op_stamp.h"
#include "harness/thread_world.h"

namespace lockstep {
namespace {

using testing::ThreadWorld;

// Memory the front end never touches: every case below is refused first.
float* not_host_memory() { return reinterpret_cast<float*>(std::uintptr_t{0x7f0000001000}); }

TEST(DeviceNames, HostAndCuda) {
  EXPECT_EQ(to_string(Device::host()), "host");
  EXPECT_EQ(to_string(Device::cuda(3)), "cuda:3");
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  EXPECT_EQ(ConstBuffer(Buffer{nullptr, 0, DType::f32, Device::cuda(1), nullptr}).device, Device::cuda(1));
}

TEST(DeviceNames, DescriptionsSayWhereCudaMemoryIs) {
  OpInfo info;
  info.count = 10;
  EXPECT_EQ(describe(info, 4), "allreduce #4 (float x 10, sum)");
  info.device = Device::cuda(1);
  EXPECT_EQ(describe(info, 4), "allreduce #4 (float x 10, sum, on cuda:1)");
  info.collective = Collective::barrier;
  EXPECT_EQ(describe(info, 5), "barrier #5 (on cuda:1)");
}

TEST(DeviceStamps, HostMemoryAgainstCudaMemoryIsAMismatch) {
  OpContext mine;
  mine.info.count = 1000;
  mine.info.device = Device::cuda(0);
  OpInfo theirs = mine.info;
  theirs.device = Device::host();
  try {
    check_round_stamp(mine, stamp_what(theirs), stamp_count(theirs), 1, "rank 0/2");
    FAIL() << "no MismatchError";
  } catch (const MismatchError& e) {
    EXPECT_NE(std::string(e.what()).find("on cuda:0"), std::string::npos) << e.what();
  }
  // Another GPU index on the peer is fine: ranks may use different GPUs.
  theirs.device = Device::cuda(5);
  EXPECT_NO_THROW(check_round_stamp(mine, stamp_what(theirs), stamp_count(theirs), 1, "rank 0/2"));
}

TEST(DeviceStamps, InlineStampsCarryTheKindAndTheRoot) {
  OpContext mine;
  mine.info.collective = Collective::broadcast;
  mine.info.count = 3;
  mine.info.peer = 2000;
  mine.info.device = Device::cuda(0);
  EXPECT_NO_THROW(check_inline_stamp(mine, inline_stamp(mine.info), 1, "rank 0/2"));
  OpInfo theirs = mine.info;
  theirs.device = Device::host();
  EXPECT_THROW(check_inline_stamp(mine, inline_stamp(theirs), 1, "rank 0/2"), MismatchError);
  theirs = mine.info;
  theirs.peer = 7;
  EXPECT_THROW(check_inline_stamp(mine, inline_stamp(theirs), 1, "rank 0/2"), MismatchError);
}

class DeviceFrontEnd : public ::testing::Test {
 protected:
  DeviceFrontEnd() : world_(1, "shm") {}
  ProcessGroup& pg() { return world_.group(0); }
  ThreadWorld world_;
};

TEST_F(DeviceFrontEnd, MixedDevicesInOneCallAreRefused) {
  std::vector<float> host(8);
  const Buffer on_gpu{not_host_memory(), 8, DType::f32, Device::cuda(0), nullptr};
  try {
    pg().allgather(ConstBuffer{host.data(), 8, DType::f32}, on_gpu);
    FAIL() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "allgather: the input is on host but the output on cuda:0; pass buffers on one device (copy one of "
              "them first)");
  }
  const Buffer on_other_gpu{not_host_memory() + 64, 8, DType::f32, Device::cuda(1), nullptr};
  EXPECT_THROW(pg().allreduce(on_gpu, on_other_gpu), InvalidArgument);
  EXPECT_THROW(pg().all_to_all(ConstBuffer{host.data(), 8, DType::f32}, {8}, on_gpu, {8}), InvalidArgument);
}

TEST_F(DeviceFrontEnd, TwoStreamsInOneCallAreRefused) {
  int a = 0, b = 0;
  const ConstBuffer in{not_host_memory(), 8, DType::f32, Device::cuda(0), &a};
  const Buffer out{not_host_memory() + 64, 8, DType::f32, Device::cuda(0), &b};
  EXPECT_THROW(pg().allreduce(in, out), InvalidArgument);
}

TEST_F(DeviceFrontEnd, PremulSumOnCudaMemoryIsRefused) {
  const Buffer on_gpu{not_host_memory(), 8, DType::f32, Device::cuda(0), nullptr};
  try {
    pg().allreduce(on_gpu, Reduction::premul_sum(0.5));
    FAIL() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("premul_sum on CUDA memory"), std::string::npos) << e.what();
  }
}

TEST_F(DeviceFrontEnd, CudaMemoryWithoutCudaSaysWhy) {
  if (built_with_cuda() && access("/dev/nvidiactl", F_OK) == 0) GTEST_SKIP() << "this machine has a CUDA device";
  const Buffer on_gpu{not_host_memory(), 8, DType::f32, Device::cuda(0), nullptr};
  try {
    pg().allreduce(on_gpu);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string want = built_with_cuda() ? "sees no CUDA device" : "built without CUDA";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  // Empty buffers go nowhere: they need no device.
  EXPECT_NO_THROW(pg().allreduce(Buffer{nullptr, 0, DType::f32, Device::cuda(0), nullptr})->wait());
  // And the group still works on host memory.
  std::vector<float> host(8, 1.0f);
  pg().allreduce(Buffer{host.data(), 8, DType::f32})->wait();
  EXPECT_EQ(host[0], 1.0f);
}

}  // namespace
}  // namespace lockstep
