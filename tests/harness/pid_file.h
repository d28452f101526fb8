// The pid file a rank program leaves for its test: written to a temporary
// name and renamed, so a test that sees the file also sees the number (a
// test polling for the file would otherwise read it empty).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace lockstep::testing {

// dir/rank<rank>.<suffix>, holding this process's pid.
inline void write_rank_file(const std::string& dir, int rank, const std::string& suffix) {
  const std::string path = dir + "/rank" + std::to_string(rank) + "." + suffix;
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << ::getpid() << '\n';
  std::rename(tmp.c_str(), path.c_str());
}

inline void write_pid_file(const std::string& dir, int rank) { write_rank_file(dir, rank, "pid"); }

}  // namespace lockstep::testing
