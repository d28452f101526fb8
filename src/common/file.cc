// Atomic file writes through an Os; see file.h.
#include "common/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  std::string hint;
  if (err == ENOSPC || err == EDQUOT) hint = "; free space on that file system or write elsewhere";
  throw Error(fmt::format("cannot {} {}: {}{}", what, path, std::strerror(err), hint));
}

// An open temporary file, removed on destruction unless it was renamed.
class Temporary {
 public:
  Temporary(Os& os, std::string path) : os_(os), path_(std::move(path)) {
    fd_ = os_.open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("create", path_, errno);
  }
  ~Temporary() {
    if (fd_ >= 0) os_.close(fd_);
    if (!renamed_) os_.unlink(path_.c_str());
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;

  // write(2) may take fewer bytes than offered (a signal, a nearly full
  // disk): the rest is offered again until all is written or it fails.
  void write(const void* data, std::size_t len) {
    const auto* p = static_cast<const char*>(data);
    while (len > 0) {
      const ssize_t n = os_.write(fd_, p, len);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("write", path_, errno);
      if (n == 0) fail("write", path_, ENOSPC);
      p += n;
      len -= static_cast<std::size_t>(n);
    }
  }

  void finish(FileSync sync) {
    if (sync == FileSync::to_disk && os_.fsync(fd_) != 0) fail("flush", path_, errno);
    const int rc = os_.close(std::exchange(fd_, -1));
    if (rc != 0) fail("write", path_, errno);  // NFS and friends report a failed write at close
  }

  void rename_to(const std::string& target) {
    if (os_.rename(path_.c_str(), target.c_str()) != 0)
      fail(fmt::format("rename {} to", path_), target, errno);
    renamed_ = true;
  }

 private:
  Os& os_;
  std::string path_;
  int fd_ = -1;
  bool renamed_ = false;
};

// Makes a rename in `dir` durable.
void sync_directory(const std::string& dir, Os& os) {
  const int fd = os.open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) fail("open the directory", dir, errno);
  const int rc = os.fsync(fd);
  const int err = errno;
  os.close(fd);
  if (rc != 0) fail("flush the directory", dir, err);
}

}  // namespace

std::string temporary_path(const std::string& path, long pid) { return fmt::format("{}.tmp.{}", path, pid); }

void write_file_atomically(const std::string& path, const std::function<void(const ByteWriter&)>& produce,
                           FileSync sync, Os& os) {
  Temporary temp(os, temporary_path(path, ::getpid()));
  produce([&](const void* data, std::size_t len) { temp.write(data, len); });
  temp.finish(sync);
  temp.rename_to(path);
  if (sync == FileSync::to_disk) {
    const std::filesystem::path target(path);
    sync_directory(target.has_parent_path() ? target.parent_path().string() : std::string("."), os);
  }
}

void write_file_atomically(const std::string& path, std::string_view contents, FileSync sync, Os& os) {
  write_file_atomically(path, [&](const ByteWriter& sink) { sink(contents.data(), contents.size()); }, sync, os);
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || (!in.good() && !in.eof()))
    throw Error(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  return bytes;
}

}  // namespace lockstep
