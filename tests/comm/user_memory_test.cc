// The program's memory stays its own over the shm backend (docs/algorithms.md,
// "The user's memory"), in ranks that are processes, as launchers start them:
// - a child made by fork, _Fork or a raw clone sees its buffers exactly as
//   they were at the fork while the parent and its peers go on all-reducing
//   them, and nothing the child writes reaches the parent; posix_spawn and
//   vfork start programs while an all-reduce is in flight;
// - a rank killed while it holds its shared region open for peers leaves
//   nothing in /dev/shm;
// - memory the program frees goes back as it would without lockstep, and a
//   run that all-reduces new buffers every step holds steady memory;
// - fork costs what it costs without lockstep.
// The binary also runs under jemalloc and tcmalloc (LD_PRELOAD; ctest's
// user_memory_test.jemalloc.* and .tcmalloc.*), where Allocator.* checks
// that the preloaded library is the one in use.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/os.h"
#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/process_group.h"

extern char** environ;

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::describe;
using testing::EnvMap;
using testing::ProcessRanks;
using testing::RankResult;

constexpr int kRanks = 2;

EnvMap shm_env(int r, int port) {
  return {{"RANK", std::to_string(r)},       {"WORLD_SIZE", std::to_string(kRanks)},
          {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", std::to_string(kRanks)},
          {"MASTER_ADDR", "127.0.0.1"},      {"MASTER_PORT", std::to_string(port)},
          {"LOCKSTEP_BACKEND", "shm"},       {"LOCKSTEP_TIMEOUT", "60"},
          {"LOCKSTEP_CONNECT_TIMEOUT", "60"}};
}

// Runs `body` in kRanks forked ranks of one shm group; every rank must end well.
void run_ranks(const std::function<void(ProcessGroup& pg, int rank)>& body, Duration deadline = 120s) {
  const testing::ReservedPort port;
  ProcessRanks ranks(
      kRanks, [&](int r) { return shm_env(r, port.number()); },
      [&](int r) {
        auto pg = init_process_group();
        body(*pg, r);
      });
  for (const RankResult& r : ranks.wait_all(deadline)) EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
}

// Rank r's buffer starts at (r + 1) + i % 5; after k >= 1 in-place sums over
// two ranks every element is 2^(k-1) * (3 + 2 * (i % 5)), exactly.
std::vector<float> start_values(std::size_t count, int rank) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
  return v;
}
float summed(std::size_t i, int times) { return static_cast<float>((3 + 2 * (i % 5)) << (times - 1)); }

void expect_summed(const std::vector<float>& v, int times, const std::string& when) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != summed(i, times))
      throw std::runtime_error(fmt::format("{}: element {} is {}, not {} (after {} all-reduces)", when, i, v[i],
                                           summed(i, times), times));
}

void allreduce(ProcessGroup& pg, std::vector<float>& v) { pg.allreduce(view(std::span(v)))->wait(); }

// --- children made by fork, _Fork and clone -------------------------------

pid_t make_child(const std::string& how) {
  if (how == "fork") return ::fork();
  if (how == "_Fork") return ::_Fork();  // runs no atfork handlers
  // A raw clone: no atfork handlers, no glibc bookkeeping at all.
  return static_cast<pid_t>(::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr));
}

class ForkedChild : public ::testing::TestWithParam<std::string> {};

// Fork-based checkpointing: the child writes out the state as of the fork
// while the parent trains on. Buffers of 8 MiB, all-reduced in place three
// times before the fork (the pattern every optimisation of in-place
// buffers keys on), twice more while the child looks.
TEST_P(ForkedChild, SeesItsBuffersAsAtTheForkAndKeepsItsWritesToItself) {
  const std::string how = GetParam();
  run_ranks([&](ProcessGroup& pg, int rank) {
    constexpr std::size_t kCount = 2 << 20;
    std::vector<float> v = start_values(kCount, rank);
    for (int i = 0; i < 3; ++i) allreduce(pg, v);
    const std::vector<float> at_fork = v;
    int go[2], done[2];
    if (::pipe(go) != 0 || ::pipe(done) != 0) throw std::runtime_error("pipe");
    const pid_t child = make_child(how);
    if (child < 0) throw std::runtime_error(fmt::format("{} failed: {}", how, std::strerror(errno)));
    if (child == 0) {
      // Async-signal-safe calls only: the parent has other threads.
      char byte = 0;
      if (::read(go[0], &byte, 1) != 1) ::_exit(4);
      const bool same = std::memcmp(v.data(), at_fork.data(), kCount * sizeof(float)) == 0;
      std::memset(v.data(), 0xff, kCount * sizeof(float));
      if (::write(done[1], &byte, 1) != 1) ::_exit(5);
      ::_exit(same ? 0 : 3);
    }
    for (int i = 0; i < 2; ++i) allreduce(pg, v);  // this rank and its peer write on
    char byte = 1;
    if (::write(go[1], &byte, 1) != 1 || ::read(done[0], &byte, 1) != 1)
      throw std::runtime_error("the child did not answer");
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw std::runtime_error(fmt::format("rank {}: the {} child saw the parent's later writes (status {:#x})",
                                           rank, how, status));
    expect_summed(v, 5, fmt::format("rank {} after its {} child wrote its copy", rank, how));
    allreduce(pg, v);
    expect_summed(v, 6, fmt::format("rank {}, the all-reduce after", rank));
    for (int fd : {go[0], go[1], done[0], done[1]}) ::close(fd);
  });
}

INSTANTIATE_TEST_SUITE_P(Ways, ForkedChild, ::testing::Values("fork", "_Fork", "clone"), [](const auto& info) {
  return info.param == "_Fork" ? std::string("underscore_Fork") : info.param;
});

// posix_spawn (CLONE_VM | CLONE_VFORK in glibc) and vfork share the
// parent's memory until the child execs: both must start their program
// while the progress thread all-reduces, and the results stay exact.
TEST(SpawnedChild, StartsItsProgramWhileAnAllReduceIsInFlight) {
  run_ranks([](ProcessGroup& pg, int rank) {
    std::vector<float> v = start_values(4 << 20, rank);
    for (int i = 1; i <= 4; ++i) {
      auto work = pg.allreduce(view(std::span(v)));
      const char* argv[] = {"/bin/sh", "-c", "exit 7", nullptr};
      pid_t child = -1;
      if (i % 2 == 1) {
        if (::posix_spawn(&child, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0)
          throw std::runtime_error("posix_spawn failed");
      } else {
        child = ::vfork();
        if (child == 0) {
          ::execve("/bin/sh", const_cast<char**>(argv), environ);
          ::_exit(127);
        }
      }
      int status = 0;
      ::waitpid(child, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 7)
        throw std::runtime_error(fmt::format("rank {}: the spawned program ended with status {:#x}", rank, status));
      work->wait();
      expect_summed(v, i, fmt::format("rank {} around a {}", rank, i % 2 == 1 ? "posix_spawn" : "vfork"));
    }
  });
}

// --- /dev/shm --------------------------------------------------------------

// Entries of /dev/shm whose name ends with ".<pid>" (lockstep's named
// segments carry their creator's pid).
std::vector<std::string> dev_shm_files_of(pid_t pid) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with("." + std::to_string(pid))) found.push_back(name);
  }
  return found;
}

// Whether process `pid` holds shared memory for its peers: a named segment of
// its own in /dev/shm, or a descriptor of a file in /dev/shm.
bool holds_shared_memory(pid_t pid) {
  if (!dev_shm_files_of(pid).empty()) return true;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec)) {
    const auto target = std::filesystem::read_symlink(fd.path(), ec);
    if (!ec && target.string().starts_with("/dev/shm/")) return true;
  }
  return false;
}

// An Os that stalls as this rank creates its shared region (with or
// without a name), as a rank that is slow to start would.
class StallsCreatingItsRegion final : public Os {
 public:
  int open(const char* path, int flags, mode_t mode) override {
    if (std::string_view(path) == "/dev/shm") std::this_thread::sleep_for(120s);
    return Os::open(path, flags, mode);
  }
  int shm_open(const char* name, int flags, mode_t mode) override {
    if ((flags & O_CREAT) != 0) std::this_thread::sleep_for(120s);
    return Os::shm_open(name, flags, mode);
  }
};

// Rank 0 creates its region and waits for rank 1, which stalls before
// making its own: rank 0 is killed (SIGKILL) in the window where its region
// must stay open for peers. A region with a name would stay in /dev/shm
// for good.
TEST(DevShm, ARankKilledWhileItWaitsForPeersLeavesNothing) {
  const testing::ReservedPort port;
  ProcessRanks ranks(
      kRanks, [&](int r) { return shm_env(r, port.number()); },
      [](int r) {
        StallsCreatingItsRegion stalls;
        GroupOptions options;
        if (r == 1) options.os = &stalls;
        init_process_group(options);
      });
  const auto deadline = Clock::now() + 60s;
  while (!holds_shared_memory(ranks.pid(0)) && Clock::now() < deadline) std::this_thread::sleep_for(2ms);
  ASSERT_TRUE(holds_shared_memory(ranks.pid(0))) << "rank 0 never made its region";
  ranks.signal(0, SIGKILL);
  ranks.signal(1, SIGKILL);
  for (const RankResult& r : ranks.wait_all(30s)) EXPECT_EQ(r.signal, SIGKILL) << describe(r);
  EXPECT_EQ(dev_shm_files_of(ranks.pid(0)), std::vector<std::string>{});
}

// --- memory given back -----------------------------------------------------

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

// Bytes of this process's shared mappings of /dev/shm files (its own
// regions and its peers').
std::size_t dev_shm_mapped_bytes() {
  std::ifstream maps("/proc/self/maps");
  std::size_t total = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/") == std::string::npos) continue;
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream(line) >> std::hex >> begin >> dash >> end;
    total += end - begin;
  }
  return total;
}

// The resident memory `steps` steps add after the first: each step makes 8
// new buffers of 4 MiB, hands each to `use`, and frees them all.
std::size_t growth_over(int steps, const std::function<void(std::vector<float>&, int step)>& use) {
  std::size_t after_first = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> buffers;
    // 1 Mi floats and up to two more: new buffers at new sizes.
    for (int b = 0; b < 8; ++b) buffers.emplace_back(std::size_t{1} << 20 | static_cast<std::size_t>((step + b) % 3));
    for (auto& v : buffers) use(v, step);
    buffers.clear();
    if (step == 0) after_first = resident_bytes();
  }
  const std::size_t now = resident_bytes();
  return now > after_first ? now - after_first : 0;
}

// Buffers all-reduced in place twice and freed, new ones each step (glibc
// hands them out with mmap and unmaps them on free): memory must stay as
// steady as the same loop's without lockstep (run first: the allocator's
// own habits, which differ between glibc, jemalloc and tcmalloc, are the
// baseline), and no shared mapping may be left behind in this rank or its
// peer (a peer that kept a view of each freed buffer would keep it alive).
TEST(MemoryGivenBack, NewBuffersEveryStepHoldSteadyMemory) {
  run_ranks([](ProcessGroup& pg, int rank) {
    ::mallopt(M_MMAP_THRESHOLD, 1 << 20);  // a fixed threshold: every buffer its own mapping
    const auto fill = [rank](std::vector<float>& v) {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
    };
    const std::size_t without = growth_over(6, [&](std::vector<float>& v, int) { fill(v); });
    const std::size_t mapped_before = dev_shm_mapped_bytes();
    const std::size_t with = growth_over(6, [&](std::vector<float>& v, int step) {
      fill(v);
      allreduce(pg, v);
      allreduce(pg, v);
      expect_summed(v, 2, fmt::format("rank {} step {}", rank, step));
    });
    pg.barrier()->wait();
    const std::size_t mapped = dev_shm_mapped_bytes();
    if (mapped != mapped_before)
      throw std::runtime_error(fmt::format("rank {}: shared memory mapped went from {} to {} bytes over 48 buffers "
                                           "all-reduced and freed",
                                           rank, mapped_before, mapped));
    if (with > without + (8 << 20))
      throw std::runtime_error(fmt::format("rank {}: resident memory grew by {} MiB over 5 steps of all-reduced "
                                           "buffers, {} MiB without all-reducing them",
                                           rank, with >> 20, without >> 20));
  });
}

// glibc's own heap: buffers below malloc's mmap threshold, all-reduced and
// freed, are given back by malloc_trim (MADV_DONTNEED, which frees only
// private pages) as they would be without lockstep. glibc only: the other
// allocators' runs leave this test out.
TEST(MemoryGivenBack, GlibcMallocTrimGivesBackAllReducedHeapBuffers) {
  run_ranks([](ProcessGroup& pg, int rank) {
    ::mallopt(M_MMAP_THRESHOLD, 64 << 20);  // 2 MiB buffers come from the heap
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and stay there until malloc_trim
    const std::size_t before = resident_bytes();
    constexpr std::size_t kCount = (2 << 20) / sizeof(float);
    std::vector<float*> buffers;
    for (int b = 0; b < 32; ++b) {
      auto* p = static_cast<float*>(std::malloc(kCount * sizeof(float)));
      for (std::size_t i = 0; i < kCount; ++i) p[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
      for (int t = 0; t < 3; ++t) pg.allreduce(Buffer{p, kCount, DType::f32})->wait();
      buffers.push_back(p);
    }
    const std::size_t holding = resident_bytes();
    for (float* p : buffers) std::free(p);
    ::malloc_trim(0);
    const std::size_t after = resident_bytes();
    if (holding < before + (48 << 20))
      throw std::runtime_error(fmt::format("rank {}: 64 MiB of buffers took only {} MiB", rank, (holding - before) >> 20));
    if (after > before + (8 << 20))
      throw std::runtime_error(fmt::format("rank {}: malloc_trim gave back {} of {} MiB", rank, (holding - after) >> 20,
                                           (holding - before) >> 20));
  });
}

// --- the cost of fork ------------------------------------------------------

// The least time and the fewest page faults in the child of `tries` forks
// (the child exits at once), waited for.
struct ForkCostSample {
  std::chrono::nanoseconds time = std::chrono::nanoseconds::max();
  long child_faults = LONG_MAX;
};

ForkCostSample cheapest_fork(int tries) {
  ForkCostSample best;
  for (int t = 0; t < tries; ++t) {
    const auto start = Clock::now();
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    struct rusage usage {};
    ::wait4(child, nullptr, 0, &usage);
    best.time = std::min(best.time, std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start));
    best.child_faults = std::min(best.child_faults, usage.ru_minflt + usage.ru_majflt);
  }
  return best;
}

// fork copies the page tables of private memory and nothing else; a
// library that shares the program's buffers behind its back makes every
// fork copy them (the adopting code's children copied every adopted page
// after the fork: a fault for each of these 64 MiB's 16384 pages).
// Compared within one process: 64 MiB touched before the group exists,
// then all-reduced in place again and again. What is asserted is the child's page faults,
// which a loaded machine does not change; the times are printed for
// docs/performance.md, whose ratio is measured on a quiet machine.
TEST(ForkCost, IsWhatItIsWithoutLockstep) {
  const testing::ReservedPort port;
  ProcessRanks ranks(
      kRanks, [&](int r) { return shm_env(r, port.number()); },
      [](int rank) {
        std::vector<float> v = start_values(16 << 20, rank);
        const ForkCostSample without = cheapest_fork(7);
        auto pg = init_process_group();
        for (int i = 0; i < 4; ++i) allreduce(*pg, v);
        const ForkCostSample with = cheapest_fork(7);
        pg->barrier()->wait();
        const double ms_without = std::chrono::duration<double, std::milli>(without.time).count();
        const double ms_with = std::chrono::duration<double, std::milli>(with.time).count();
        std::printf("rank %d: fork %.2f ms (child: %ld page faults) before the group, %.2f ms (%ld) after its "
                    "all-reduces\n",
                    rank, ms_without, without.child_faults, ms_with, with.child_faults);
        if (with.child_faults > without.child_faults + 512)
          throw std::runtime_error(fmt::format("rank {}: a forked child took {} page faults after the all-reduces, {} "
                                               "before: the fork copies memory the group touched",
                                               rank, with.child_faults, without.child_faults));
      });
  for (const RankResult& r : ranks.wait_all(120s)) {
    EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
    std::printf("%s", r.output.c_str());  // the times, for docs/performance.md
  }
}

// --- single copy refused --------------------------------------------------

// A seccomp filter that makes process_vm_readv fail with ENOSYS in this
// process, as a container's profile may.
void refuse_cross_memory_attach() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0)
    throw std::runtime_error(fmt::format("cannot install the seccomp filter: {}", std::strerror(errno)));
}

// Rank 1 may not read its peer's memory: every rank goes through the slots
// (a rank reading while its peer waits in the slots would hang both), the
// large broadcasts and all-gathers are exact, and rank 0 says why once.
TEST(SingleCopy, RefusedToOneRankTakesEveryRankToTheSlotsAndSaysWhy) {
  const testing::ReservedPort port;
  ProcessRanks ranks(
      kRanks,
      [&](int r) {
        EnvMap env = shm_env(r, port.number());
        env["LOCKSTEP_LOG_LEVEL"] = "info";
        return env;
      },
      [](int rank) {
        if (rank == 1) refuse_cross_memory_attach();
        auto pg = init_process_group();
        constexpr std::size_t kCount = 1 << 18;  // 1 MiB of floats: single copy where allowed
        std::vector<float> mine = start_values(kCount, rank), all(kRanks * kCount);
        pg->allgather(view(std::span(mine)), view(std::span(all)))->wait();
        for (int q = 0; q < kRanks; ++q)
          if (all[static_cast<std::size_t>(q) * kCount + 7] != static_cast<float>(q + 1 + 2))
            throw std::runtime_error(fmt::format("rank {}: allgather's block {} is wrong", rank, q));
        pg->broadcast(view(std::span(mine)), 1)->wait();
        if (mine != start_values(kCount, 1)) throw std::runtime_error(fmt::format("rank {}: broadcast wrong", rank));
      });
  const auto results = ranks.wait_all(120s);
  for (const RankResult& r : results) EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
  EXPECT_NE(results[0].output.find("no single copy (rank 1: cannot read rank 0's memory: Function not implemented: "
                                   "process_vm_readv is refused here"),
            std::string::npos)
      << results[0].output;
  EXPECT_EQ(results[1].output.find("no single copy"), std::string::npos) << "said twice: " << results[1].output;
}

// --- ordinary buffers by cross-memory attach --------------------------------

// LOCKSTEP_SHM_ORDINARY_PATH=single-copy in three processes: peers read and
// write each rank's own buffers, in place and out of place (where the
// input must stay as it was), with the result of the slots bit for bit
// (each element summed in rank order, which this rank recomputes).
TEST(SingleCopyAllreduce, OrdinaryBuffersInPlaceAndOutOfPlaceAreExact) {
  constexpr int kThree = 3;
  const testing::ReservedPort port;
  ProcessRanks ranks(
      kThree,
      [&](int r) {
        EnvMap env = shm_env(r, port.number());
        env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(kThree);
        env["LOCKSTEP_SHM_ORDINARY_PATH"] = "single-copy";
        env["LOCKSTEP_LOG_LEVEL"] = "debug";
        return env;
      },
      [](int rank) {
        auto pg = init_process_group();
        // Values whose float sums round differently in another order.
        const auto value = [](int q, std::size_t i) { return 1.0f / static_cast<float>(3 + q + 7 * (i % 101)); };
        for (std::size_t count : {std::size_t{1} << 16, (std::size_t{3} << 20) + 5}) {
          std::vector<float> input(count), output(count, -1.0f), expected(count);
          for (std::size_t i = 0; i < count; ++i) {
            input[i] = value(rank, i);
            expected[i] = (value(0, i) + value(1, i)) + value(2, i);
          }
          const std::vector<float> input_before = input;
          pg->allreduce(ConstBuffer{input.data(), count, DType::f32}, Buffer{output.data(), count, DType::f32})->wait();
          if (output != expected) throw std::runtime_error(fmt::format("out of place, {} floats: wrong sum", count));
          if (input != input_before) throw std::runtime_error(fmt::format("out of place, {} floats: input changed", count));
          allreduce(*pg, input);
          if (input != expected) throw std::runtime_error(fmt::format("in place, {} floats: wrong sum", count));
        }
      });
  const auto results = ranks.wait_all(120s);
  for (const RankResult& r : results) EXPECT_EQ(r.exit_code, testing::kExitOk) << describe(r);
  EXPECT_NE(results[0].output.find("single copy on (ordinary buffers of all-reduces and broadcasts too)"), std::string::npos)
      << results[0].output;
}

// --- the allocator in use ---------------------------------------------------

// Under ctest's allocator runs (LD_PRELOAD names jemalloc or tcmalloc) that
// library must be mapped in this process, and in the others neither: a
// preload that silently failed would make those runs glibc's again.
TEST(Allocator, IsTheOneThisRunIsFor) {
  const std::string preload = std::getenv("LD_PRELOAD") ? std::getenv("LD_PRELOAD") : "";
  const char* expected = preload.find("libjemalloc") != std::string::npos   ? "libjemalloc"
                         : preload.find("libtcmalloc") != std::string::npos ? "libtcmalloc"
                                                                            : nullptr;
  std::ifstream maps("/proc/self/maps");
  const std::string all((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  for (const char* other : {"libjemalloc", "libtcmalloc"}) {
    if (expected == nullptr || std::string(expected) != other) {
      EXPECT_EQ(all.find(other), std::string::npos) << other << " is loaded in a run not meant for it";
    }
  }
  if (expected != nullptr) {
    EXPECT_NE(all.find(expected), std::string::npos) << expected << " is not loaded";
  }
}

}  // namespace
}  // namespace lockstep
