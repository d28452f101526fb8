// See single_copy.h.
#include "comm/shm/single_copy.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

namespace lockstep::shm {

namespace {

// One direction of cross-memory attach: `call` is process_vm_readv or
// process_vm_writev, moving `bytes` between `local` (here) and `remote`.
template <typename Call>
std::string transfer(Call call, pid_t pid, char* local, char* remote, std::size_t bytes) {
  // The kernel moves at most about 2 GiB per call, and a call may stop
  // short: go on from where it stopped.
  while (bytes > 0) {
    iovec mine{local, bytes};
    iovec theirs{remote, bytes};
    const ssize_t n = call(pid, &mine, 1, &theirs, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return cross_memory_refusal(errno, pid);
    }
    if (n == 0) return "the peer's memory ended early";
    local += n;
    remote += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return "";
}

}  // namespace

std::string read_peer(pid_t pid, void* local, const void* remote, std::size_t bytes) {
  return transfer(::process_vm_readv, pid, static_cast<char*>(local), static_cast<char*>(const_cast<void*>(remote)),
                  bytes);
}

std::string write_peer(pid_t pid, void* remote, const void* local, std::size_t bytes) {
  return transfer(::process_vm_writev, pid, static_cast<char*>(const_cast<void*>(local)), static_cast<char*>(remote),
                  bytes);
}

std::string cross_memory_refusal(int err, pid_t pid) {
  const char* what = std::strerror(err);
  switch (err) {
    case EPERM: {
      int scope = 0;
      std::ifstream("/proc/sys/kernel/yama/ptrace_scope") >> scope;
      if (scope > 0)
        return fmt::format("{}: Yama's ptrace_scope is {} (0 lets a process read its own user's processes: "
                           "sysctl kernel.yama.ptrace_scope=0), or give the ranks CAP_SYS_PTRACE",
                           what, scope);
      return fmt::format("{}: reading process {}'s memory needs the same user and a dumpable process, or "
                         "CAP_SYS_PTRACE",
                         what, pid);
    }
    case ENOSYS:
      return fmt::format("{}: process_vm_readv is refused here (a container's seccomp profile, or a kernel "
                         "without CONFIG_CROSS_MEMORY_ATTACH)",
                         what);
    case ESRCH: return fmt::format("{}: process {} is not visible here (another pid namespace?)", what, pid);
    default: return what;
  }
}

}  // namespace lockstep::shm
