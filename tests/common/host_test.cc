// Random identifiers (store tokens, job ids): random even when /dev/urandom
// cannot be opened, and an error, never a constant, when the kernel gives no
// random bytes. Each case runs in a forked child, since it cripples the
// process (no file descriptors left; a seccomp filter).
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

#include "common/host.h"
#include "harness/process_ranks.h"
#include "harness/refused_syscalls.h"
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

TEST(Host, RandomHexFailsClearlyWithoutRandomBytes) {
  if (testing::kSeccompAuditArch == 0) GTEST_SKIP() << "no seccomp architecture constant for this CPU";
  const auto r = in_child([] {
    testing::refuse_syscalls({SYS_getrandom}, ENOSYS);  // as an old kernel or a strict container policy would
    std::printf("token %s\n", random_hex(16).c_str());
  });
  EXPECT_EQ(r.exit_code, testing::kExitOtherError) << testing::describe(r);
  EXPECT_NE(r.output.find("cannot read random bytes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("getrandom failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("token "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace lockstep
