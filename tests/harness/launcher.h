// Test harness: runs `lockstep run ARGS...` (the real launcher binary) in a
// child process with extra environment, capturing its output; plus temporary
// directories and a check that processes are gone. Not thread-safe.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <string>
#include <vector>

#include "harness/process_ranks.h"

namespace lockstep::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class Launcher {
 public:
  // `cli` is the path of the lockstep binary.
  Launcher(const std::string& cli, std::vector<std::string> args, EnvMap env = {});
  pid_t pid() const { return ranks_.pid(0); }
  void signal(int sig) { ranks_.signal(0, sig); }
  RankResult wait(Duration timeout);
  // What it has printed so far (it may still run).
  std::string output_so_far() const;
  // Waits until its output contains `what`; false on timeout. Tests wait
  // for what the launcher says rather than sleep a guess.
  bool wait_for_output(const std::string& what, Duration timeout) const;

 private:
  ProcessRanks ranks_;
};

// Runs `program ARGS...` directly, without a launcher, with extra
// environment; its exit code and output, or killed at `timeout`.
RankResult run_program(const std::string& program, std::vector<std::string> args, EnvMap env, Duration timeout);

// Whether a program's output mentions `what`.
inline bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// How many times a program's output mentions `what` (without overlaps).
inline std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

// The direct children of a process (e.g. a launcher's ranks).
std::vector<pid_t> children_of(pid_t pid);

// True once the process no longer runs (gone or a zombie); reaps orphans
// handed to this process.
bool gone(pid_t pid);

// The pids rank programs wrote to <dir>/rank<r>.pid, r < ranks (missing
// files are skipped).
std::vector<pid_t> pids_in(const std::string& dir, int ranks);
// Every pid is gone within a few seconds (a test failure otherwise); any
// left is killed, so a failing test leaves nothing behind either.
void expect_gone(const std::vector<pid_t>& pids);

// A file's bytes ("" if it cannot be read): parameters a run wrote.
std::string read_bytes(const std::string& path);

}  // namespace lockstep::testing
