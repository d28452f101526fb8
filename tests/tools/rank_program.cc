// A rank for launcher tests; the first argument picks its behaviour:
//   ok           join the group, all-reduce, print "rank R of W sum S"
//   fail         rank $FAIL_RANK prints to stderr and exits 3; others wait
//   always-fail  rank 1 exits 4 on every attempt
//   restart      rank 1 exits 5 on attempt 0; every rank succeeds later
//   sleep        wait (to be signalled)
//   ignore-term  ignore SIGTERM, then wait (the launcher must SIGKILL)
//   die-in-shm-setup     rank 1 kills itself (SIGKILL) as it opens rank 0's
//                        shm region, while both set up
//   die-in-shared-alloc  the same as it opens rank 0's copy of the first
//                        allocate_shared buffer
//   die-in-named-shm-setup, die-in-named-shared-alloc  the same where rank 1
//                        may not open its peers' descriptors, so that the
//                        regions go through named files in /dev/shm
//   leave-early  rank 1 leaves after one all-reduce (its process ends
//                150 ms after its group); the others issue a second and
//                print the error they get to stderr (exit 2)
//   pause S W    all-reduce, sleep outside any collective (S seconds in a
//                world of W ranks, half a second in any other), all-reduce
//                again, print "rank R of W sum S", then stay
//                $LINGER_SECONDS (default 0) outside the group (a last
//                checkpoint)
// Each rank writes its pid to $PID_DIR/rank<R>.pid when PID_DIR is set.
#include <lockstep/error.h>
#include <lockstep/error_file.h>
#include <lockstep/process_group.h>

#include "common/os.h"
#include "harness/pid_file.h"
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

void wait_forever() {
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// An Os that kills this process as it opens (not creates) a region of rank
// 0's: `what` "r0" is rank 0's region, "a0r0" its copy of the first shared
// allocation. Rank 0 holds that region open (its descriptor, or its name)
// until this rank says it mapped it, so the kill always lands in the same
// window of set-up on every run. (Polling /dev/shm for a segment missed
// segments that lived less than the poll's period, and the test failed
// under load.) With `named`, this process may not open its peers'
// descriptors (as in another pid namespace), so regions get names, and the
// kill lands while rank 0's is in /dev/shm.
class DiesOpeningRank0Segment final : public lockstep::Os {
 public:
  DiesOpeningRank0Segment(const std::string& what, bool named)
      : marker_("." + what + "."), opens_until_kill_(what == "r0" ? 1 : 2), named_(named) {}
  int open(const char* path, int flags, mode_t mode) override {
    if (std::string_view(path).starts_with("/proc/") && std::string_view(path).find("/fd/") != std::string_view::npos) {
      if (named_) {
        errno = EACCES;
        return -1;
      }
      if (--opens_until_kill_ == 0) ::raise(SIGKILL);
    }
    return Os::open(path, flags, mode);
  }
  int shm_open(const char* name, int flags, mode_t mode) override {
    if ((flags & O_CREAT) == 0 && std::string_view(name).find(marker_) != std::string_view::npos) ::raise(SIGKILL);
    return Os::shm_open(name, flags, mode);
  }

 private:
  std::string marker_;
  int opens_until_kill_;  // with 2 ranks: one peer region at set-up, one per allocation
  bool named_;
};

// All-reduces once; rank 1 then leaves (destroying its group), the others
// issue a second all-reduce that rank 1 never joins.
int leave_early(int rank) {
  try {
    bool leaving = false;
    {
      auto pg = lockstep::init_process_group();
      int value = 1;
      pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
      leaving = rank == 1;
      if (!leaving) pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
    }
    if (leaving) {
      std::printf("rank 1 leaving early\n");
      std::fflush(stdout);
      // A real program takes a while to end after its group is gone
      // (destructors, unloading libraries); its peers fail before it exits.
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    return 0;
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  // Under mpirun or srun alone, their own variables.
  const int rank = env_int("RANK", env_int("OMPI_COMM_WORLD_RANK", env_int("SLURM_PROCID", 0)));
  const int attempt = env_int("LOCKSTEP_RESTART_COUNT", 0);
  if (const char* dir = std::getenv("PID_DIR")) lockstep::testing::write_pid_file(dir, rank);
  std::printf("rank %d attempt %d starting (local rank %s of %s, node %s)\n", rank, attempt, std::getenv("LOCAL_RANK"),
              std::getenv("LOCAL_WORLD_SIZE"), std::getenv("GROUP_RANK"));
  std::fflush(stdout);
  if (mode == "sleep") wait_forever();
  if (mode == "ignore-term") {
    signal(SIGTERM, SIG_IGN);
    wait_forever();
  }
  if (mode == "fail" && rank == env_int("FAIL_RANK", 1)) {
    // Fail only once every rank is up (and has left its pid for the test).
    if (const char* dir = std::getenv("PID_DIR")) {
      const int world = env_int("WORLD_SIZE", 1);
      for (int tries = 0; tries < 500; ++tries) {
        int present = 0;
        for (int r = 0; r < world; ++r) present += std::ifstream(std::string(dir) + "/rank" + std::to_string(r) + ".pid") ? 1 : 0;
        if (present == world) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::fprintf(stderr, "rank %d failing on purpose\n", rank);
    return 3;
  }
  if (mode == "fail") wait_forever();
  if (mode == "always-fail" && rank == 1) return 4;
  if (mode == "record-error" && rank == 1) {
    // What an example's main does with the error that ends it.
    lockstep::record_error(lockstep::ConfigError("rank 1 gave up on purpose"));
    return 4;
  }
  if (mode == "record-error") wait_forever();
  if (mode.starts_with("die-in-")) {
    DiesOpeningRank0Segment dies(mode.ends_with("shm-setup") ? "r0" : "a0r0", mode.starts_with("die-in-named-"));
    lockstep::GroupOptions options;
    if (rank == 1) options.os = &dies;
    auto pg = lockstep::init_process_group(options);
    pg->allocate_shared(1 << 20);
    if (rank == 1) {
      std::fprintf(stderr, "rank 1 never opened rank 0's segment\n");
      return 9;
    }
    return 0;
  }
  if (mode == "leave-early") return leave_early(rank);
  // "loop-then-ok": the first attempt all-reduces until it fails, later
  // ones end as "ok" does.
  if (mode == "allreduce-loop" || (mode == "loop-then-ok" && attempt == 0)) {
    // Collectives until the launcher stops the rank. Rank 0 ignores SIGTERM
    // (as a program finishing its step would) and is killed at the end of
    // the grace period, so it is still in a collective when its peers go.
    if (rank == 0) signal(SIGTERM, SIG_IGN);
    try {
      auto pg = lockstep::init_process_group();
      for (int value = 1;; value = 1) pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
    } catch (const lockstep::Error& e) {
      std::fprintf(stderr, "rank_program: %s\n", e.what());
      return 2;
    }
  }
  if (mode == "pause") {
    auto pg = lockstep::init_process_group();
    int value = 1;
    pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
    const bool long_pause = argc > 3 && pg->size() == std::atoi(argv[3]);
    std::printf("rank %d of %d pausing outside any collective\n", pg->rank(), pg->size());
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(long_pause ? std::atoi(argv[2]) * 1000 : 500));
    value = pg->rank() + 1;
    pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
    std::printf("rank %d of %d sum %d\n", pg->rank(), pg->size(), value);
    std::fflush(stdout);
    pg.reset();
    std::this_thread::sleep_for(std::chrono::seconds(env_int("LINGER_SECONDS", 0)));
    return 0;
  }
  if (mode == "restart" && rank == 1 && attempt == 0) return 5;
  auto pg = lockstep::init_process_group();
  int value = pg->rank() + 1;
  pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
  std::printf("rank %d of %d sum %d\n", pg->rank(), pg->size(), value);
  return 0;
}
