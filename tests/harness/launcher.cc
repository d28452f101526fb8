// Launcher harness; see launcher.h.
#include "harness/launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "common/clock.h"

namespace lockstep::testing {

TempDir::TempDir() {
  char tmpl[] = "/tmp/lockstep-test-XXXXXX";
  path_ = ::mkdtemp(tmpl);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Launcher::Launcher(const std::string& cli, std::vector<std::string> args, EnvMap env)
    : ranks_(1, [env](int) { return env; },
             [cli, args](int) {
               std::vector<std::string> argv{cli, "run"};
               argv.insert(argv.end(), args.begin(), args.end());
               std::vector<char*> c;
               for (auto& a : argv) c.push_back(a.data());
               c.push_back(nullptr);
               ::execv(cli.c_str(), c.data());
               throw std::runtime_error("cannot execute " + cli);
             }) {}

bool Launcher::wait_for_output(const std::string& what, Duration timeout) const {
  const Deadline deadline = Deadline::after(timeout);
  while (output_so_far().find(what) == std::string::npos) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

std::string Launcher::output_so_far() const {
  std::ifstream log(ranks_.dir() + "/rank0.log");
  std::stringstream text;
  text << log.rdbuf();
  return text.str();
}

RankResult Launcher::wait(Duration timeout) { return ranks_.wait_all(timeout)[0]; }

RankResult run_program(const std::string& program, std::vector<std::string> args, EnvMap env, Duration timeout) {
  ProcessRanks child(1, [env](int) { return env; },
                     [program, args](int) {
                       std::vector<std::string> argv{program};
                       argv.insert(argv.end(), args.begin(), args.end());
                       std::vector<char*> c;
                       for (auto& a : argv) c.push_back(a.data());
                       c.push_back(nullptr);
                       ::execv(program.c_str(), c.data());
                       throw std::runtime_error("cannot execute " + program);
                     });
  return child.wait_all(timeout)[0];
}

std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  pid_t child = 0;
  while (in >> child) out.push_back(child);
  return out;
}

bool gone(pid_t pid) {
  while (::waitpid(-1, nullptr, WNOHANG) > 0) {
  }
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

std::vector<pid_t> pids_in(const std::string& dir, int ranks) {
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = 0;
    std::ifstream(dir + "/rank" + std::to_string(r) + ".pid") >> pid;
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

void expect_gone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    const Deadline deadline = Deadline::after(std::chrono::seconds(5));
    while (!gone(pid) && !deadline.expired()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(gone(pid)) << "process " << pid << " left running";
    if (!gone(pid)) ::kill(pid, SIGKILL);
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace lockstep::testing
