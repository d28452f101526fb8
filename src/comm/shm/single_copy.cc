// See single_copy.h.
#include "comm/shm/single_copy.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace lockstep::shm {

std::string read_peer(pid_t pid, void* local, const void* remote, std::size_t bytes) {
  auto* to = static_cast<char*>(local);
  const auto* from = static_cast<const char*>(remote);
  // The kernel moves at most about 2 GiB per call, and a call may stop
  // short: go on from where it stopped.
  while (bytes > 0) {
    iovec mine{to, bytes};
    iovec theirs{const_cast<char*>(from), bytes};
    const ssize_t n = ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::strerror(errno);
    }
    if (n == 0) return "the peer's memory ended early";
    to += n;
    from += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return "";
}

}  // namespace lockstep::shm
