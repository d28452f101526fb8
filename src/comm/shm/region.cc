// Shared-memory regions; see region.h.
#include "comm/shm/region.h"
#include "comm/launcher_cleanup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "common/env.h"
#include "common/env_vars.h"
#include "lockstep/error.h"

namespace lockstep::shm {

Region::~Region() {
  stop_sharing();
  unlink();
  unmap();
}

void Region::stop_sharing() {
  if (fd_ >= 0) os_->close(fd_);
  fd_ = -1;
}

void Region::unmap() {
  if (data_) os_->munmap(data_, bytes_);
  data_ = nullptr;
}

Region::Region(Region&& other) noexcept
    : os_(other.os_),
      name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      linked_(std::exchange(other.linked_, false)),
      fd_(std::exchange(other.fd_, -1)) {}

Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    stop_sharing();
    unlink();
    unmap();
    os_ = other.os_;
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    linked_ = std::exchange(other.linked_, false);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

namespace {

// Sizes the file behind `fd`, reserves its pages and maps it; closes `fd`
// on failure. `what` names the region in errors.
std::byte* size_and_map(int fd, std::size_t bytes, const std::string& what, Os& os) {
  if (os.ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    os.close(fd);
    throw Error(fmt::format("shm: cannot size {} to {} bytes ({}); /dev/shm may be too small", what, bytes,
                            std::strerror(err)));
  }
  // Reserve the pages now: on a full tmpfs the first write to an unreserved
  // page kills the process with SIGBUS, with no word of why (the "bus error"
  // of containers with a 64 MiB /dev/shm).
  if (const int err = os.allocate(fd, static_cast<off_t>(bytes)); err != 0) {
    os.close(fd);
    throw ConfigError(fmt::format(
        "shm: /dev/shm has no room for {} more MiB ({}: {}). It is full or too small: free space there, give the "
        "container more (e.g. docker run --shm-size=2g), or choose another backend with {}=tcp",
        (bytes + (1 << 20) - 1) >> 20, what, std::strerror(err), env::kBackend));
  }
  void* p = os.mmap_shared(fd, bytes);
  if (p == MAP_FAILED) {
    const int err = errno;
    os.close(fd);
    throw Error(fmt::format("shm: cannot map {}: {}", what, std::strerror(err)));
  }
  // First touch by the owner: the pages are allocated near this core.
  std::memset(p, 0, bytes);
  return static_cast<std::byte*>(p);
}

// What may keep this process from opening a peer's descriptor, by errno.
std::string why_not_opened(int err, pid_t pid) {
  switch (err) {
    case EACCES:
    case EPERM:
      return fmt::format("{}: reading another process's descriptors needs the same user and a dumpable process, "
                         "or CAP_SYS_PTRACE",
                         std::strerror(err));
    case ENOENT:
    case ESRCH:
      return fmt::format("{}: process {} is not visible here (another pid namespace?) or has exited",
                         std::strerror(err), pid);
    default: return std::strerror(err);
  }
}

}  // namespace

Region Region::create(const std::string& name, std::size_t bytes, Os& os) {
  const int fd = os.shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST)
    throw Error(fmt::format(
        "shm: cannot create /dev/shm{}: a segment of that name already exists, most likely left by a crashed job "
        "with the same id and the same pid. Remove it (rm /dev/shm{}) if no such job is running, then start again",
        name, name));
  if (fd < 0)
    throw Error(fmt::format("shm: cannot create /dev/shm{} ({}); is /dev/shm mounted and writable?", name,
                            std::strerror(errno)));
  Region r;
  r.os_ = &os;
  r.name_ = name;
  r.linked_ = true;
  r.data_ = size_and_map(fd, bytes, name, os);
  r.bytes_ = bytes;
  os.close(fd);
  return r;
}

Region Region::create_unnamed(std::size_t bytes, std::string& why, Os& os) {
  const int fd = os.open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    why = fmt::format("no unnamed file in /dev/shm ({})", std::strerror(errno));
    return Region();
  }
  Region r;
  r.os_ = &os;
  r.data_ = size_and_map(fd, bytes, "an unnamed region", os);
  r.bytes_ = bytes;
  r.fd_ = fd;
  return r;
}

Region Region::open_unnamed(pid_t pid, int fd, std::size_t bytes, std::string& why, Os& os) {
  const std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  const int own = os.open(path.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (own < 0) {
    why = fmt::format("cannot open {} ({})", path, why_not_opened(errno, pid));
    return Region();
  }
  struct stat st {};
  if (::fstat(own, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    os.close(own);
    why = fmt::format("{} is not the region expected (another file, or smaller)", path);
    return Region();
  }
  void* p = os.mmap_shared(own, bytes);
  const int map_error = errno;
  os.close(own);
  if (p == MAP_FAILED) {
    why = fmt::format("cannot map {}: {}", path, std::strerror(map_error));
    return Region();
  }
  Region r;
  r.os_ = &os;
  r.data_ = static_cast<std::byte*>(p);
  r.bytes_ = bytes;
  return r;
}

Region Region::open(const std::string& name, std::size_t bytes, Os& os) {
  const int fd = os.shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw PeerError(fmt::format("shm: cannot open a peer's region {} ({})", name, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    os.close(fd);
    throw PeerError(fmt::format("shm: a peer's region {} is smaller than expected", name));
  }
  void* p = os.mmap_shared(fd, bytes);
  const int map_error = errno;
  os.close(fd);
  if (p == MAP_FAILED) throw Error(fmt::format("shm: cannot map {}: {}", name, std::strerror(map_error)));
  Region r;
  r.os_ = &os;
  r.name_ = name;
  r.data_ = static_cast<std::byte*>(p);
  r.bytes_ = bytes;
  return r;
}

void Region::unlink() {
  if (linked_) os_->shm_unlink(name_.c_str());
  linked_ = false;
}

std::string region_name(const std::string& stem, const std::string& what) {
  return region_name_of(stem, what, ::getpid());
}

std::string region_name_of(const std::string& stem, const std::string& what, pid_t pid) {
  return fmt::format("/lockstep.{}.{}.{}", stem, what, pid);
}

bool is_segment_tag(const std::string& tag) {
  if (tag.empty() || tag.size() > kMaxSegmentTagLength) return false;
  return std::all_of(tag.begin(), tag.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

std::size_t remove_tagged_segments(const std::string& tag) {
  if (!is_segment_tag(tag)) return 0;
  const std::string prefix = "lockstep." + tag + ".";
  std::size_t removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(prefix, 0) == 0 && ::shm_unlink(("/" + file).c_str()) == 0) ++removed;
  }
  return removed;
}

void sweep_stale_regions() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("lockstep.", 0) != 0) continue;
    const auto dot = file.rfind('.');
    const auto pid = parse_int(file.substr(dot + 1));
    if (!pid || *pid <= 0) continue;
    // A region younger than a minute may belong to a job still setting up
    // in another pid namespace; leave it.
    const auto age = std::filesystem::file_time_type::clock::now() - entry.last_write_time(ec);
    if (ec || age < std::chrono::minutes(1)) continue;
    if (::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH) ::shm_unlink(("/" + file).c_str());
  }
}

}  // namespace lockstep::shm

namespace lockstep {

std::size_t remove_launcher_segments(const std::string& tag) { return shm::remove_tagged_segments(tag); }

}  // namespace lockstep
