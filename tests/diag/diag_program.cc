// A rank for diagnostics tests; the first argument picks the scenario:
//   skip      rank 1 skips the first of two allreduces, then idles
//   skip-broadcast  rank 1 skips a broadcast the others issue before an
//             allreduce (what DETAIL mode can see: the next collective differs)
//   stuck     rank 1 idles before its first collective
//   mismatch  rank 1 issues a broadcast where the others issue an allreduce
//   idle      one allreduce, then idle (to be sent SIGUSR1); rank<r>.ready in PID_DIR says it is idle
// Errors are printed to stderr and make the rank exit 1. Each rank writes
// its pid to $PID_DIR/rank<R>.pid.
#include <lockstep/process_group.h>

#include "harness/pid_file.h"
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

void idle() { std::this_thread::sleep_for(std::chrono::seconds(60)); }

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "skip";
  try {
    auto pg = lockstep::init_process_group();
    const int rank = pg->rank();
    if (const char* dir = std::getenv("PID_DIR"))
      lockstep::testing::write_pid_file(dir, rank);
    std::vector<float> v(1000, 1.0f), w(10, 1.0f);
    if (mode == "skip") {
      if (rank != 1) pg->allreduce(lockstep::view(std::span(v)))->wait();
      pg->allreduce(lockstep::view(std::span(v)))->wait();
      if (rank == 1) idle();
    } else if (mode == "skip-broadcast") {
      if (rank != 1) pg->broadcast(lockstep::view(std::span(w)), 0)->wait();
      pg->allreduce(lockstep::view(std::span(v)))->wait();
    } else if (mode == "stuck") {
      if (rank == 1) idle();
      pg->allreduce(lockstep::view(std::span(v)))->wait();
    } else if (mode == "mismatch") {
      if (rank == 1)
        pg->broadcast(lockstep::view(std::span(w)), 0)->wait();
      else
        pg->allreduce(lockstep::view(std::span(v)))->wait();
    } else if (mode == "idle") {
      pg->allreduce(lockstep::view(std::span(v)))->wait();
      if (const char* dir = std::getenv("PID_DIR")) lockstep::testing::write_rank_file(dir, rank, "ready");
      std::printf("ready\n");
      std::fflush(stdout);
      idle();
    }
    std::printf("rank %d done\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
