// Host facts and random identifiers; see host.h. Stateless; thread-safe.
#include "common/host.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep {

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

std::string random_hex(std::size_t bytes) {
  // getrandom(2) needs no file descriptor, so a missing or unreadable
  // /dev/urandom (a chroot, a full fd table) cannot turn into a constant
  // token. It returns fewer bytes than asked only when interrupted.
  std::vector<unsigned char> random(bytes);
  std::size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(random.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(fmt::format("cannot read random bytes for a job id or store token: getrandom failed: {}; "
                              "lockstep needs the kernel's getrandom system call (Linux 3.17 or later, not "
                              "blocked by a seccomp policy)",
                              n < 0 ? std::strerror(errno) : "no bytes returned"));
    got += static_cast<std::size_t>(n);
  }
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char b : random) out += fmt::format("{:02x}", b);
  return out;
}

}  // namespace lockstep
