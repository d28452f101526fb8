// A seccomp filter that makes some system calls fail with an errno in the
// calling thread and the threads it starts later, as a strict container
// policy or an old kernel would: for tests of what the library does when
// the system refuses it. It cannot be removed: call it in a forked child
// or in a thread that ends.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <vector>

namespace lockstep::testing {

#if defined(__x86_64__)
constexpr std::uint32_t kSeccompAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kSeccompAuditArch = AUDIT_ARCH_AARCH64;
#else
constexpr std::uint32_t kSeccompAuditArch = 0;  // tests skip: no constant for this CPU
#endif

// Each call in `numbers` (SYS_...) fails with `error`; everything else is
// allowed. Throws where the filter cannot be installed.
inline void refuse_syscalls(std::initializer_list<long> numbers, int error) {
  std::vector<sock_filter> program = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kSeccompAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
  };
  // Each refused number jumps to the refusal, past the ones after it.
  const auto count = static_cast<unsigned char>(numbers.size());
  unsigned char left = count;
  for (long n : numbers) {
    --left;
    program.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(n),
                               static_cast<unsigned char>(left + 1), 0));
  }
  program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  program.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<std::uint32_t>(error) & SECCOMP_RET_DATA)));
  sock_fprog fprog{static_cast<unsigned short>(program.size()), program.data()};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0)
    throw std::runtime_error("cannot install the seccomp filter");
}

}  // namespace lockstep::testing
