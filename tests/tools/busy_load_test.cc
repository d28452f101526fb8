// `lockstep bench --busy N`'s spinning processes: they run while the load
// lives, and none is left, even unreaped, once it goes.
#include "bench/busy_load.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace lockstep::cli {
namespace {

// The children of this process, from /proc (running, sleeping or zombie).
std::vector<pid_t> children() {
  std::vector<pid_t> pids;
  std::ifstream file("/proc/self/task/" + std::to_string(::getpid()) + "/children");
  for (pid_t pid; file >> pid;) pids.push_back(pid);
  return pids;
}

// 'R' while it spins (it may be between time slices: 'R' is runnable too).
char state_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

TEST(BusyLoad, SpinsWhileItLivesAndLeavesNoProcessBehind) {
  ASSERT_TRUE(children().empty());
  std::vector<pid_t> started;
  {
    const BusyLoad load(3);
    EXPECT_EQ(load.size(), 3);
    started = children();
    ASSERT_EQ(started.size(), 3u);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (pid_t pid : started) EXPECT_EQ(state_of(pid), 'R') << "busy process " << pid << " is not running";
  }
  EXPECT_TRUE(children().empty()) << "busy processes left (running or unreaped) after the load went";
  for (pid_t pid : started) EXPECT_EQ(::kill(pid, 0), -1) << pid;
}

TEST(BusyLoad, NoneIsNothing) {
  const BusyLoad load(0);
  EXPECT_EQ(load.size(), 0);
  EXPECT_TRUE(children().empty());
}

}  // namespace
}  // namespace lockstep::cli
