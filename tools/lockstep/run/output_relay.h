// Relays one rank's stdout or stderr to the launcher's, line by line, each
// line prefixed with "[rank] ", optionally copied to a per-rank log file, and
// keeps the last lines for the failure summary. Partial lines are held until
// their newline arrives (or the stream ends), so ranks never interleave
// mid-line. Owned by the launcher's loop; not thread-safe.
#pragma once

#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace lockstep::cli {

class OutputRelay {
 public:
  // `out` is the launcher's stream (null: redirected to the log only); `log` may be null; `prefix` may be empty.
  OutputRelay(std::FILE* out, std::FILE* log, std::string prefix, std::size_t keep_lines = 20);

  void feed(const char* data, std::size_t len);
  // End of stream: flush a last line without newline.
  void finish();

  const std::deque<std::string>& last_lines() const { return last_; }

  // Also copies the lines that contain any of `filters` to `file`, prefixed
  // "[rank] " (torchrun's --duplicate-stdout-filters; the file is shared by
  // every rank of the attempt). Both must outlive the relay.
  void duplicate_matching(std::FILE* file, const std::vector<std::string>* filters, std::string rank_prefix);

 private:
  void emit(const std::string& line);

  std::FILE* out_;
  std::FILE* log_;
  std::string prefix_;
  std::size_t keep_;
  std::string partial_;
  std::deque<std::string> last_;
  std::FILE* matching_ = nullptr;
  const std::vector<std::string>* filters_ = nullptr;
  std::string rank_prefix_;
};

}  // namespace lockstep::cli
