// A rank for launcher tests; the first argument picks its behaviour:
//   ok           join the group, all-reduce, print "rank R of W sum S"
//   fail         rank $FAIL_RANK prints to stderr and exits 3; others wait
//   always-fail  rank 1 exits 4 on every attempt
//   restart      rank 1 exits 5 on attempt 0; every rank succeeds later
//   sleep        wait (to be signalled)
//   ignore-term  ignore SIGTERM, then wait (the launcher must SIGKILL)
//   die-in-shm-setup     rank 1 kills itself (SIGKILL) within a millisecond
//                        of rank 0 creating its shm region, while both set up
//   die-in-shared-alloc  the same once rank 0 has created its copy of the
//                        first allocate_shared buffer
//   leave-early  rank 1 leaves after one all-reduce (its process ends
//                150 ms after its group); the others issue a second and
//                print the error they get to stderr (exit 2)
// Each rank writes its pid to $PID_DIR/rank<R>.pid when PID_DIR is set.
#include <lockstep/error.h>
#include <lockstep/process_group.h>

#include "harness/pid_file.h"
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

void wait_forever() {
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

// Waits (up to 20 s) until rank 0 has created a shared-memory segment
// whose name ends with ".<what>.<rank 0's pid>", then dies as abruptly as
// it can, at a point of rank 0's set-up that is the same on every run.
void die_once_rank0_created(const std::string& what) {
  const char* dir = std::getenv("PID_DIR");
  if (!dir) std::abort();
  for (int tries = 0; tries < 20000; ++tries) {
    pid_t rank0 = 0;
    std::ifstream(std::string(dir) + "/rank0.pid") >> rank0;
    const std::string suffix = "." + what + "." + std::to_string(rank0);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = entry.path().filename().string();
      if (rank0 > 0 && name.rfind("lockstep.", 0) == 0 && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        ::raise(SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::fprintf(stderr, "rank 0 never created its %s segment\n", what.c_str());
  std::exit(9);
}

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
  const int rank = env_int("RANK", 0);
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
  if (mode == "die-in-shm-setup" && rank == 1) {
    // Set-up needs both ranks: join on another thread, die from this one.
    // The joining thread keeps its group: were it dropped, a set-up that
    // finished before the kill would end it cleanly, and rank 0 would see
    // rank 1 leave instead of die.
    std::thread([] {
      try {
        auto kept = lockstep::init_process_group();
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      } catch (const lockstep::Error&) {
      }
    }).detach();
    die_once_rank0_created("r0");
  }
  if (mode == "die-in-shared-alloc") {
    auto pg = lockstep::init_process_group();
    if (rank == 1) die_once_rank0_created("a0r0");
    pg->allocate_shared(1 << 20);
    return 0;
  }
  if (mode == "leave-early") return leave_early(rank);
  if (mode == "restart" && rank == 1 && attempt == 0) return 5;
  auto pg = lockstep::init_process_group();
  int value = pg->rank() + 1;
  pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
  std::printf("rank %d of %d sum %d\n", pg->rank(), pg->size(), value);
  return 0;
}
