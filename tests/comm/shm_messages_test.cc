// What the shm backend says when set-up or a wait fails: a segment name
// that is already taken is named as such (not as a /dev/shm problem), and a
// wait during the agreement that precedes a large all-reduce over shared
// buffers is named as that agreement, not as "a small operation".
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <string>

#include <fmt/format.h>

#include "comm/shm/region.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShmMessages, ASegmentNameAlreadyTakenIsNamedAsSuch) {
  const std::string name = fmt::format("/lockstep.msgtest.r0.{}", ::getpid());
  shm::Region first = shm::Region::create(name, 4096);
  const std::string message = message_of([&] { shm::Region::create(name, 4096); });
  EXPECT_NE(message.find("already exists"), std::string::npos) << message;
  EXPECT_NE(message.find("/dev/shm" + name), std::string::npos) << message;
  EXPECT_EQ(message.find("mounted and writable"), std::string::npos) << message;
}

TEST(ShmMessages, AWaitWhileAgreeingOnSharedBuffersIsNamedAsSuch) {
  testing::ThreadWorld world(2, "shm", 1s);
  const auto errors = world.run_collecting([](int rank, ProcessGroup& pg) {
    auto shared = pg.allocate_shared(8u << 20);
    if (rank == 1) return;  // never joins rank 0's all-reduce
    const std::size_t count = (9u << 20) / 2 / sizeof(float);  // 4.5 MiB
    pg.allreduce(Buffer{shared.get(), count, DType::f32})->wait();
  });
  ASSERT_TRUE(errors[0]);
  const std::string message = message_of([&] { std::rethrow_exception(errors[0]); });
  EXPECT_EQ(message.find("small operation"), std::string::npos) << message;
  EXPECT_NE(message.find("shared buffers"), std::string::npos) << message;
}

}  // namespace
}  // namespace lockstep
