// A large buffer from a root to a receiver on its machine: written by the
// root into the receiver's memory where the receiver's pages are new to
// it, else sent; either way the receiver ends with the root's bytes. The
// ranks are threads of one process here (the root then writes into its
// own process); between processes, the replacement tests check the bytes
// a replacement was fed (replacement_test, in_place_recovery_test).
#include "torch/written_across.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstddef>
#include <functional>
#include <vector>

#include "harness/refused_syscalls.h"
#include "torch/thread_ranks.h"

namespace lockstep::torch {
namespace {

using testing::TorchThreadWorld;

constexpr int kRoot = 1;
constexpr int kReceiver = 0;
// Above glibc's largest threshold for mapping an allocation anew (32 MiB):
// a tensor this large is always memory new to the process.
constexpr std::int64_t kFloats = (40 << 20) / 4;

::torch::Tensor roots_values() { return ::torch::arange(kFloats, ::torch::kFloat) * 3 + 1; }

Buffer buffer_of(::torch::Tensor& t) { return Buffer{t.data_ptr(), static_cast<std::size_t>(t.numel()), DType::f32}; }

// One transfer of `received` (on the receiver) from the root's values:
// how many transport transfers each side appended.
std::vector<std::size_t> transfer(const char* backend, ::torch::Tensor& received,
                                  const std::function<void()>& on_the_root = [] {}) {
  ::torch::Tensor sent = roots_values();
  std::vector<std::size_t> appended(2, 0);
  TorchThreadWorld world(2, backend);
  world.run([&](int rank, ProcessGroup& pg) {
    std::vector<std::shared_ptr<Work>> transfers;
    if (rank == kRoot) {
      on_the_root();
      write_across(pg, buffer_of(sent), kReceiver, 7, transfers);
    } else {
      receive_written_across(pg, buffer_of(received), kRoot, 7, transfers);
    }
    wait_all(transfers);
    appended[static_cast<std::size_t>(rank)] = transfers.size();
  });
  return appended;
}

TEST(WrittenAcross, IntoNewMemoryTheRootWrites) {
  for (const char* backend : {"shm", "tcp"}) {
    ::torch::Tensor received = ::torch::empty({kFloats}, ::torch::kFloat);  // no page touched yet
    const auto appended = transfer(backend, received);
    EXPECT_TRUE(::torch::equal(received, roots_values())) << backend;
    EXPECT_EQ(appended[kReceiver], 0u) << backend << ": the receiver waited on a transport receive";
    EXPECT_EQ(appended[kRoot], 0u) << backend << ": the root sent by the transport";
  }
}

TEST(WrittenAcross, IntoPresentMemoryTheTransportCopies) {
  ::torch::Tensor received = ::torch::zeros({kFloats}, ::torch::kFloat);  // every page written
  const auto appended = transfer("shm", received);
  EXPECT_TRUE(::torch::equal(received, roots_values()));
  EXPECT_EQ(appended[kReceiver], 1u);
  EXPECT_EQ(appended[kRoot], 1u);
}

TEST(WrittenAcross, SmallOrDeviceBuffersAreNotWritten) {
  float small[16] = {};
  EXPECT_FALSE(goes_written_across(Buffer{small, 16, DType::f32}));
  EXPECT_TRUE(goes_written_across(Buffer{small, std::size_t{2} << 20, DType::u8}));
  EXPECT_FALSE(goes_written_across(Buffer{small, std::size_t{2} << 20, DType::u8, Device{DeviceKind::cuda, 0}}));
}

TEST(WrittenAcross, WhereRefusedTheTransportCarriesTheBytes) {
  if (testing::kSeccompAuditArch == 0) GTEST_SKIP() << "no seccomp architecture constant for this CPU";
  ::torch::Tensor received = ::torch::empty({kFloats}, ::torch::kFloat);
  // As a container's policy refuses it; the root's thread ends with the run.
  const auto appended = transfer("shm", received, [] {
    testing::refuse_syscalls({SYS_process_vm_readv, SYS_process_vm_writev}, EPERM);
  });
  EXPECT_TRUE(::torch::equal(received, roots_values()));
  EXPECT_EQ(appended[kReceiver], 1u);
  EXPECT_EQ(appended[kRoot], 1u);
}

}  // namespace
}  // namespace lockstep::torch
