// A rank for launcher tests; the first argument picks its behaviour:
//   ok           join the group, all-reduce, print "rank R of W sum S"
//   fail         rank $FAIL_RANK prints to stderr and exits 3; others wait
//   always-fail  rank 1 exits 4 on every attempt
//   restart      rank 1 exits 5 on attempt 0; every rank succeeds later
//   sleep        wait (to be signalled)
//   ignore-term  ignore SIGTERM, then wait (the launcher must SIGKILL)
// Each rank writes its pid to $PID_DIR/rank<R>.pid when PID_DIR is set.
#include <lockstep/process_group.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int rank = env_int("RANK", 0);
  const int attempt = env_int("LOCKSTEP_RESTART_COUNT", 0);
  if (const char* dir = std::getenv("PID_DIR")) std::ofstream(std::string(dir) + "/rank" + std::to_string(rank) + ".pid") << ::getpid();
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
  if (mode == "restart" && rank == 1 && attempt == 0) return 5;
  auto pg = lockstep::init_process_group();
  int value = pg->rank() + 1;
  pg->allreduce(lockstep::Buffer{&value, 1, lockstep::DType::i32})->wait();
  std::printf("rank %d of %d sum %d\n", pg->rank(), pg->size(), value);
  return 0;
}
