// The real system calls behind Os; see os.h. Stateless; thread-safe.
#include "common/os.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace lockstep {

Os& Os::real() {
  // Stateless, so one shared instance is not shared mutable state.
  static Os os;
  return os;
}

Clock::time_point Os::now() { return Clock::now(); }
Clock::time_point Os::coarse_now() { return lockstep::coarse_now(); }
void Os::sleep_for(Duration d) { std::this_thread::sleep_for(d); }

ssize_t Os::send(int fd, const void* data, std::size_t len, int flags) { return ::send(fd, data, len, flags); }
ssize_t Os::recv(int fd, void* data, std::size_t len, int flags) { return ::recv(fd, data, len, flags); }
int Os::poll(pollfd* fds, nfds_t count, int timeout_ms) { return ::poll(fds, count, timeout_ms); }
int Os::connect(int fd, const sockaddr* addr, socklen_t len) { return ::connect(fd, addr, len); }
int Os::accept(int listener, int flags) { return ::accept4(listener, nullptr, nullptr, flags); }

int Os::open(const char* path, int flags, mode_t mode) { return ::open(path, flags, mode); }
ssize_t Os::write(int fd, const void* data, std::size_t len) { return ::write(fd, data, len); }
int Os::fsync(int fd) { return ::fsync(fd); }
int Os::rename(const char* from, const char* to) { return std::rename(from, to); }
int Os::unlink(const char* path) { return ::unlink(path); }
int Os::close(int fd) { return ::close(fd); }

int Os::shm_open(const char* name, int flags, mode_t mode) { return ::shm_open(name, flags, mode); }
int Os::shm_unlink(const char* name) { return ::shm_unlink(name); }
int Os::ftruncate(int fd, off_t len) { return ::ftruncate(fd, len); }
int Os::allocate(int fd, off_t len) { return ::posix_fallocate(fd, 0, len); }
void* Os::mmap_shared(int fd, std::size_t len) {
  return ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
}
int Os::munmap(void* addr, std::size_t len) { return ::munmap(addr, len); }

}  // namespace lockstep
