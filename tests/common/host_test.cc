// Random identifiers (store tokens, job ids): random even when /dev/urandom
// cannot be opened, and an error, never a constant, when the kernel gives no
// random bytes. Each case runs in a forked child, since it cripples the
// process (no file descriptors left; a seccomp filter).
#include <gtest/gtest.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

#include "common/host.h"
#include "harness/process_ranks.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

// Runs `fn` in one forked child; its exit code and output.
testing::RankResult in_child(const std::function<void()>& fn) {
  testing::ProcessRanks child(1, [](int) { return testing::EnvMap{}; }, [&](int) { fn(); });
  return child.wait_all(20s).front();
}

TEST(Host, RandomHexHasTwoDigitsPerByte) {
  const std::string a = random_hex(16), b = random_hex(16);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

// An unreadable /dev/urandom used to give the token ffff...ff: here no file
// can be opened at all (the descriptor limit is 0).
TEST(Host, RandomHexNeedsNoDeviceFile) {
  const auto r = in_child([] {
    const rlimit none{0, 0};
    if (::setrlimit(RLIMIT_NOFILE, &none) != 0) throw std::runtime_error("setrlimit failed");
    const std::string token = random_hex(16);
    std::printf("token %s\n", token.c_str());
    if (token == std::string(32, 'f')) throw std::runtime_error("constant token");
  });
  EXPECT_EQ(r.exit_code, 0) << testing::describe(r);
}

#if defined(__x86_64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr std::uint32_t kAuditArch = AUDIT_ARCH_AARCH64;
#else
constexpr std::uint32_t kAuditArch = 0;
#endif

// Makes getrandom fail with ENOSYS in this process, as an old kernel or a
// strict container policy would.
void block_getrandom() {
  sock_filter program[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAuditArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getrandom, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog fprog{static_cast<unsigned short>(sizeof program / sizeof program[0]), program};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0)
    throw std::runtime_error("cannot install the seccomp filter");
}

TEST(Host, RandomHexFailsClearlyWithoutRandomBytes) {
  if (kAuditArch == 0) GTEST_SKIP() << "no seccomp architecture constant for this CPU";
  const auto r = in_child([] {
    block_getrandom();
    std::printf("token %s\n", random_hex(16).c_str());
  });
  EXPECT_EQ(r.exit_code, testing::kExitOtherError) << testing::describe(r);
  EXPECT_NE(r.output.find("cannot read random bytes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("getrandom failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("token "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
