// Where the ranks' error files go when the user gave no --log-dir, as under
// torchrun: a temporary directory, removed when the launcher ends. A
// launcher killed with SIGKILL cannot remove its own, so each name carries
// its launcher's pid and the next launcher removes those whose launcher is
// gone (as the shared-memory segments are, by their tag). Not thread-safe.
#pragma once

#include <filesystem>

namespace lockstep::cli {

class ScratchDirectory {
 public:
  ScratchDirectory() = default;
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  ~ScratchDirectory();

  // Creates <temp dir>/lockstep-run-<pid>-XXXXXX (after removing those of
  // launchers no longer running); throws lockstep::Error naming the cause.
  const std::filesystem::path& create();

 private:
  std::filesystem::path path_;
};

}  // namespace lockstep::cli
