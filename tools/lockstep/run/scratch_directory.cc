// ScratchDirectory; see scratch_directory.h.
#include "run/scratch_directory.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "common/env.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

constexpr char kPrefix[] = "lockstep-run-";

// Removes the directories of launchers that no longer run.
void remove_orphans(const std::filesystem::path& temp) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(temp, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const std::string rest = name.substr(sizeof kPrefix - 1);
    const auto pid = parse_int(rest.substr(0, rest.find('-')));
    if (!pid || *pid <= 0 || ::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH) continue;
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

ScratchDirectory::~ScratchDirectory() {
  std::error_code ignored;
  if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
}

const std::filesystem::path& ScratchDirectory::create() {
  const std::filesystem::path temp = std::filesystem::temp_directory_path();
  remove_orphans(temp);
  std::string pattern = (temp / fmt::format("{}{}-XXXXXX", kPrefix, ::getpid())).string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw Error(fmt::format("cannot create a directory for the ranks' error files ({}): {}; set TMPDIR or give "
                            "--log-dir",
                            pattern, std::strerror(errno)));
  path_ = pattern;
  return path_;
}

}  // namespace lockstep::cli
