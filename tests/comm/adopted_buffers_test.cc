// Ordinary buffers adopted into shared memory by the shm backend
// (src/comm/shm/adopted_buffers.h): results stay exact before and after
// adoption, with each rank's buffer at another offset in its page; a buffer
// unmapped and mapped anew at the same address, or resized, is never read
// through the old adoption; two groups in one process leave each other's
// adoptions alone; a forked child gets a private copy; and the switch off
// adopts nothing.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "comm/shm/adopted_buffers.h"
#include "common/os.h"
#include "harness/thread_world.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

using shm::AdoptedBuffers;
using testing::ThreadWorld;

constexpr std::size_t kPage = 4096;

// The path of the mapping holding p ("" for anonymous memory).
std::string mapping_at(const void* p) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream fields(line);
    fields >> std::hex >> begin >> dash >> end;
    if (at < begin || at >= end) continue;
    std::string perms, offset, dev, inode, path;
    fields >> perms >> offset >> dev >> inode;
    std::getline(fields >> std::ws, path);
    return path;
  }
  return "(unmapped)";
}
bool adopted(const void* p) { return mapping_at(p).find(".adopt-") != std::string::npos; }

// The shm backend adopts only while /dev/shm keeps half of itself and 1 GiB
// free (a container's default 64 MiB: never).
bool room_in_dev_shm() {
  struct statvfs shm {};
  return ::statvfs("/dev/shm", &shm) == 0 &&
         AdoptedBuffers::leaves_room(64u << 20, std::uint64_t{shm.f_bavail} * shm.f_frsize,
                                     std::uint64_t{shm.f_blocks} * shm.f_frsize);
}
constexpr char kNoRoom[] = "/dev/shm is too small or too full for adoption (it keeps half of itself and 1 GiB free)";

// A buffer of `count` floats in its own anonymous mapping, starting
// `head_bytes` into its first page (so each rank's pages fall elsewhere).
class PlacedBuffer {
 public:
  PlacedBuffer(std::size_t count, std::size_t head_bytes) : count_(count), head_(head_bytes) {
    map_at(nullptr);
  }
  ~PlacedBuffer() { ::munmap(base_, mapped_bytes()); }
  PlacedBuffer(const PlacedBuffer&) = delete;
  PlacedBuffer& operator=(const PlacedBuffer&) = delete;

  float* data() const { return reinterpret_cast<float*>(static_cast<std::byte*>(base_) + head_); }
  std::size_t count() const { return count_; }
  const void* interior() const { return static_cast<std::byte*>(base_) + kPage; }
  // Unmaps the memory and maps fresh anonymous memory at the same address,
  // as an allocator may after a free.
  void remap_fresh() {
    void* old = base_;
    ASSERT_EQ(::munmap(base_, mapped_bytes()), 0);
    map_at(old);
    ASSERT_EQ(base_, old);
  }

 private:
  std::size_t mapped_bytes() const { return (head_ + count_ * sizeof(float) + kPage - 1) / kPage * kPage; }
  void map_at(void* hint) {
    base_ = ::mmap(hint, mapped_bytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (hint ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    ASSERT_NE(base_, MAP_FAILED);
  }
  std::size_t count_;
  std::size_t head_;
  void* base_ = nullptr;
};

// Rank r's element i in operation t: small integers, exact in float sums,
// different in every operation (a stale read shows).
float value(int r, std::size_t i, int t) { return static_cast<float>((r + 1) * (t + 1) + static_cast<int>(i % 17)); }
float sum(int n, std::size_t i, int t) {
  return static_cast<float>((t + 1) * n * (n + 1) / 2 + n * static_cast<int>(i % 17));
}

// Fills, all-reduces in place and checks every element; "" when right.
std::string allreduce_and_check(ProcessGroup& pg, float* data, std::size_t count, int rank, int t) {
  for (std::size_t i = 0; i < count; ++i) data[i] = value(rank, i, t);
  pg.allreduce(Buffer{data, count, DType::f32})->wait();
  for (std::size_t i = 0; i < count; ++i)
    if (data[i] != sum(pg.size(), i, t))
      return fmt::format("rank {} op {}: element {} of {} is {}, want {}", rank, t, i, count, data[i],
                         sum(pg.size(), i, t));
  return "";
}

class Failures {
 public:
  void add(std::string failure) {
    if (failure.empty()) return;
    std::lock_guard lock(mutex_);
    all_.push_back(std::move(failure));
  }
  std::string first() const { return all_.empty() ? "" : all_.front(); }

 private:
  std::mutex mutex_;
  std::vector<std::string> all_;
};

// 1 MiB and an odd number of floats more: several two-shot rounds and a
// tail that ends mid-page.
constexpr std::size_t kCount = (1 << 18) + 3001;
std::size_t head_of(int rank) { return 64 * (1 + 5 * static_cast<std::size_t>(rank)); }

TEST(AdoptionNames, OnlyTheWhatFieldCounts) {
  EXPECT_TRUE(shm::is_adoption_name("/lockstep.ab12cd.adopt-3.4242"));
  EXPECT_TRUE(shm::is_adoption_name("/lockstep.job-7.ab12cd.adopt-0.4242"));
  EXPECT_FALSE(shm::is_adoption_name("/lockstep.adopt-x.ab12cd.r0.4242"));  // a tag, not the what
  EXPECT_FALSE(shm::is_adoption_name("/lockstep.ab12cd.r0.4242"));
  EXPECT_FALSE(shm::is_adoption_name("/other.ab12cd.adopt-3.4242"));
  EXPECT_FALSE(shm::is_adoption_name(""));
}

std::string maps() {
  std::ifstream in("/proc/self/maps");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(AdoptionRules, OnlyPrivateAnonymousPagesQualify) {
  constexpr std::size_t kBytes = 4 * kPage;
  void* anon = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* shared = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(anon, MAP_FAILED);
  ASSERT_NE(shared, MAP_FAILED);
  const auto* a = static_cast<std::byte*>(anon);
  const auto* s = static_cast<std::byte*>(shared);
  EXPECT_TRUE(AdoptedBuffers::private_anonymous(maps(), a, a + kBytes));
  EXPECT_FALSE(AdoptedBuffers::private_anonymous(maps(), s, s + kBytes));
  ASSERT_EQ(::mprotect(anon, kPage, PROT_READ), 0);
  EXPECT_FALSE(AdoptedBuffers::private_anonymous(maps(), a, a + kBytes)) << "a read-only page";
  EXPECT_TRUE(AdoptedBuffers::private_anonymous(maps(), a + kPage, a + kBytes));
  ::munmap(anon, kBytes);
  EXPECT_FALSE(AdoptedBuffers::private_anonymous(maps(), a, a + kBytes)) << "unmapped memory";
  ::munmap(shared, kBytes);
  // The heap, as /proc/self/maps names it.
  const std::string heap = "55d0c0000000-55d0c8000000 rw-p 00000000 00:00 0                          [heap]\n";
  EXPECT_TRUE(AdoptedBuffers::private_anonymous(heap, reinterpret_cast<std::byte*>(0x55d0c1000000),
                                                reinterpret_cast<std::byte*>(0x55d0c2000000)));
  ASSERT_TRUE(AdoptedBuffers::can_check_mappings())
      << "/proc/self/map_files cannot name the file behind a mapping here; the shm backend then adopts nothing";
}

TEST(AdoptionRules, NothingIsAdoptedWhereADeviceMayHoldHostPages) {
  const std::string plain =
      "7f0000000000-7f0000100000 rw-p 00000000 00:00 0\n"
      "7f0000100000-7f0000200000 r-xp 00000000 fe:01 1234                       /usr/lib/x86_64-linux-gnu/libc.so.6\n";
  EXPECT_EQ(AdoptedBuffers::dma_device_mapped(plain), "");
  EXPECT_EQ(AdoptedBuffers::dma_device_mapped(maps()), "") << "this test process maps a device";
  for (const std::string device : {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/kfd",
                                   "/dev/infiniband/uverbs0", "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"})
    EXPECT_EQ(AdoptedBuffers::dma_device_mapped(plain + "7f0000300000-7f0000400000 rw-s 00000000 00:06 77   " +
                                                device + "\n"),
              device);
}

TEST(AdoptionRules, NothingIsAdoptedBesideAMallocThatCountsOnZeroedPages) {
  const std::string plain = "7f0000100000-7f0000200000 r-xp 00000000 fe:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6\n";
  EXPECT_EQ(AdoptedBuffers::replacement_allocator_mapped(plain), "");
  EXPECT_EQ(AdoptedBuffers::replacement_allocator_mapped(maps()), "") << "this test process has one loaded";
  for (const std::string library : {"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/libtcmalloc_minimal.so.4",
                                    "/opt/lib/libmimalloc.so.2.1"})
    EXPECT_EQ(AdoptedBuffers::replacement_allocator_mapped(plain + "7f0000300000-7f0000400000 r-xp 00000000 fe:01 99   " +
                                                           library + "\n"),
              library);
}

TEST(AdoptionRules, DevShmKeepsHalfOfItselfAndAGibibyteFree) {
  constexpr std::uint64_t kMiB = 1 << 20, kGiB = 1 << 30;
  EXPECT_TRUE(AdoptedBuffers::leaves_room(96 * kMiB, 12 * kGiB, 12 * kGiB));
  EXPECT_FALSE(AdoptedBuffers::leaves_room(7 * kGiB, 12 * kGiB, 12 * kGiB)) << "less than half left";
  EXPECT_FALSE(AdoptedBuffers::leaves_room(1 * kMiB, 64 * kMiB, 64 * kMiB)) << "a container's default /dev/shm";
  EXPECT_FALSE(AdoptedBuffers::leaves_room(2 * kGiB, 1 * kGiB, 12 * kGiB)) << "more than is free";
}

TEST(AdoptedBuffers, InPlaceAllReducesStayExactBeforeAndAfterAdoption) {
  if (!room_in_dev_shm()) GTEST_SKIP() << kNoRoom;
  for (int n : {2, 3}) {
    ThreadWorld world(n, "shm");
    Failures failures;
    world.run([&](int rank, ProcessGroup& pg) {
      PlacedBuffer buffer(kCount, head_of(rank));
      for (int t = 0; t < 6; ++t) {
        failures.add(allreduce_and_check(pg, buffer.data(), kCount, rank, t));
        // Adopted on the second sighting, at every rank.
        if (adopted(buffer.interior()) != (t >= 1))
          failures.add(fmt::format("rank {}/{} after op {}: mapped from '{}'", rank, n, t, mapping_at(buffer.interior())));
      }
    });
    EXPECT_EQ(failures.first(), "");
  }
}

TEST(AdoptedBuffers, MemoryMappedAnewAtTheSameAddressIsNeverReadThroughTheOldAdoption) {
  if (!room_in_dev_shm()) GTEST_SKIP() << kNoRoom;
  ThreadWorld world(2, "shm");
  Failures failures;
  world.run([&](int rank, ProcessGroup& pg) {
    PlacedBuffer buffer(kCount, head_of(rank));
    int t = 0;
    for (; t < 3; ++t) failures.add(allreduce_and_check(pg, buffer.data(), kCount, rank, t));
    if (!adopted(buffer.interior())) failures.add(fmt::format("rank {}: not adopted after 3 operations", rank));
    const std::string first_file = mapping_at(buffer.interior());
    // Rank 0 alone gets fresh memory: its peers still map its old file,
    // whose contents would be stale.
    if (rank == 0) buffer.remap_fresh();
    for (; t < 6; ++t) failures.add(allreduce_and_check(pg, buffer.data(), kCount, rank, t));
    // Memory that came and went is not adopted again (each time would cost a copy).
    if (rank == 0 && adopted(buffer.interior()))
      failures.add(fmt::format("rank 0: fresh memory adopted: '{}'", mapping_at(buffer.interior())));
    if (rank == 1 && mapping_at(buffer.interior()) != first_file)
      failures.add(fmt::format("rank 1: its adoption changed: '{}'", mapping_at(buffer.interior())));
    // The same address with fewer elements overlaps the adopted pages: the
    // ordinary path, still exact.
    for (; t < 9; ++t) failures.add(allreduce_and_check(pg, buffer.data(), kCount - 1500, rank, t));
  });
  EXPECT_EQ(failures.first(), "");
}

TEST(AdoptedBuffers, TwoGroupsInOneProcessLeaveEachOthersAdoptionsAlone) {
  if (!room_in_dev_shm()) GTEST_SKIP() << kNoRoom;
  ThreadWorld first(2, "shm");
  ThreadWorld second(2, "shm");
  Failures failures;
  std::vector<std::unique_ptr<PlacedBuffer>> shared_by_both, second_only;
  for (int rank = 0; rank < 2; ++rank) {
    shared_by_both.push_back(std::make_unique<PlacedBuffer>(kCount, head_of(rank)));
    second_only.push_back(std::make_unique<PlacedBuffer>(kCount, head_of(rank + 1)));
  }
  const auto ops = [&](ThreadWorld& world, std::vector<std::unique_ptr<PlacedBuffer>>& buffers, int from, int to) {
    world.run([&](int rank, ProcessGroup& pg) {
      for (int t = from; t < to; ++t)
        failures.add(allreduce_and_check(pg, buffers[static_cast<std::size_t>(rank)]->data(), kCount, rank, t));
    });
  };
  ops(first, shared_by_both, 0, 3);
  std::vector<std::string> files;
  for (const auto& b : shared_by_both) files.push_back(mapping_at(b->interior()));
  // The second group finds another group's file there and uses the slots.
  ops(second, shared_by_both, 3, 6);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(adopted(shared_by_both[rank]->interior()));
    EXPECT_EQ(mapping_at(shared_by_both[rank]->interior()), files[rank]) << "the second group took over rank " << rank;
  }
  // Both groups at once: one on the first group's buffer, the other
  // adopting its own.
  std::thread concurrently([&] { ops(second, second_only, 0, 6); });
  ops(first, shared_by_both, 6, 12);
  concurrently.join();
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(adopted(second_only[rank]->interior()));
  ops(first, shared_by_both, 12, 14);
  EXPECT_EQ(failures.first(), "");
}

TEST(AdoptedBuffers, AForkedChildGetsAPrivateCopy) {
  if (!room_in_dev_shm()) GTEST_SKIP() << kNoRoom;
  ThreadWorld world(2, "shm");
  std::vector<std::unique_ptr<PlacedBuffer>> buffers;
  for (int rank = 0; rank < 2; ++rank) buffers.push_back(std::make_unique<PlacedBuffer>(kCount, head_of(rank)));
  Failures failures;
  const auto ops = [&](int from, int to) {
    world.run([&](int rank, ProcessGroup& pg) {
      for (int t = from; t < to; ++t)
        failures.add(allreduce_and_check(pg, buffers[static_cast<std::size_t>(rank)]->data(), kCount, rank, t));
    });
  };
  ops(0, 3);
  ASSERT_EQ(failures.first(), "");
  float* data = buffers[0]->data();
  ASSERT_TRUE(adopted(buffers[0]->interior()));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The contents as at the fork, private memory, and writes that stay here.
    int status = 0;
    for (std::size_t i = 0; i < kCount; ++i)
      if (data[i] != sum(2, i, 2)) status = 1;
    if (adopted(buffers[0]->interior())) status |= 2;
    std::memset(data, 0xff, kCount * sizeof(float));
    ::_exit(status);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of a signal";
  EXPECT_EQ(WEXITSTATUS(status) & 1, 0) << "the child saw other contents than at the fork";
  EXPECT_EQ(WEXITSTATUS(status) & 2, 0) << "the child's copy was still the shared mapping";
  for (std::size_t i = 0; i < kCount; ++i)
    ASSERT_EQ(data[i], sum(2, i, 2)) << "the child's write reached the parent at element " << i;
  ops(3, 5);  // the group and its adoption go on
  EXPECT_TRUE(adopted(buffers[0]->interior()));
  EXPECT_EQ(failures.first(), "");
}

// Rank `rank` of an shm group of `n` thread ranks over `store`, for tests
// that set options per rank (ThreadWorld gives all ranks the same).
GroupOptions shm_rank(int rank, int n, std::shared_ptr<Store> store) {
  GroupOptions options;
  options.rank = rank;
  options.world_size = n;
  options.store = std::move(store);
  options.backend = "shm";
  return options;
}

TEST(AdoptedBuffers, RanksStartedByDifferentLaunchersFindEachOthersFiles) {
  // Two nodes of one job on one machine: each node's launcher gives its
  // ranks its own segment tag, so the files' names differ by more than the pid.
  if (!room_in_dev_shm()) GTEST_SKIP() << kNoRoom;
  constexpr int kRanks = 3;
  auto store = std::make_shared<HashStore>();
  std::vector<std::shared_ptr<ProcessGroup>> groups(kRanks);
  Failures failures;
  const auto errors = testing::run_threads(kRanks, [&](int rank) {
    GroupOptions options = shm_rank(rank, kRanks, store);
    options.config = Config{};
    options.config->shm_tag = rank == 0 ? "node-a" : "node-b";
    groups[static_cast<std::size_t>(rank)] = init_process_group(options);
    PlacedBuffer buffer(kCount, head_of(rank));
    for (int t = 0; t < 4; ++t)
      failures.add(allreduce_and_check(*groups[static_cast<std::size_t>(rank)], buffer.data(), kCount, rank, t));
    if (!adopted(buffer.interior())) failures.add(fmt::format("rank {}: not adopted", rank));
    groups[static_cast<std::size_t>(rank)].reset();
  });
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  EXPECT_EQ(failures.first(), "");
}

// An Os that cannot open other ranks' adopted buffers.
class CannotOpenAdoptions final : public Os {
 public:
  int shm_open(const char* name, int flags, mode_t mode) override {
    if ((flags & O_CREAT) == 0 && std::string_view(name).find(".adopt-") != std::string_view::npos) {
      errno = EACCES;
      return -1;
    }
    return Os::shm_open(name, flags, mode);
  }
};

TEST(AdoptedBuffers, ARankThatCannotMapANewAdoptionTakesEveryoneThroughTheSlots) {
  if (!room_in_dev_shm()) GTEST_SKIP() << kNoRoom;
  constexpr int kRanks = 3;
  auto store = std::make_shared<HashStore>();
  CannotOpenAdoptions refusing_os;
  Failures failures;
  const auto errors = testing::run_threads(kRanks, [&](int rank) {
    GroupOptions options = shm_rank(rank, kRanks, store);
    if (rank == 2) options.os = &refusing_os;
    auto group = init_process_group(options);
    PlacedBuffer buffer(kCount, head_of(rank));
    for (int t = 0; t < 4; ++t) failures.add(allreduce_and_check(*group, buffer.data(), kCount, rank, t));
  });
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  EXPECT_EQ(failures.first(), "");
}

TEST(AdoptedBuffers, SwitchedOffNothingIsAdopted) {
  GroupOptions options;
  options.config = Config{};
  options.config->shm_adopt_buffers = false;
  ThreadWorld world(2, "shm", std::chrono::seconds(60), options);
  Failures failures;
  world.run([&](int rank, ProcessGroup& pg) {
    PlacedBuffer buffer(kCount, head_of(rank));
    for (int t = 0; t < 3; ++t) failures.add(allreduce_and_check(pg, buffer.data(), kCount, rank, t));
    if (adopted(buffer.interior())) failures.add(fmt::format("rank {}: adopted although switched off", rank));
  });
  EXPECT_EQ(failures.first(), "");
}

}  // namespace
}  // namespace lockstep
