// Faults injected through GroupOptions::os, at the public API: the system
// calls of a whole process group (its backend, its sub-groups, the store it
// creates) go through the Os it was given. Rank 0 of two thread-ranks gets a
// FaultyOs, rank 1 the real calls; each test checks what both ranks are told
// and that neither waits out its timeout.
#include <gtest/gtest.h>

#include <cerrno>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "faults/faulty_os.h"
#include "harness/bare_config.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using testing::FaultyOs;
using Call = FaultyOs::Call;

constexpr Duration kTimeout = 30s;

GroupOptions options_for(int rank, const std::shared_ptr<Store>& store, const std::string& backend, Os* os) {
  GroupOptions options;
  options.config = testing::bare_config();
  options.rank = rank;
  options.world_size = 2;
  options.store = store;
  options.backend = backend;
  options.timeout = kTimeout;
  options.connect_timeout = kTimeout;
  options.os = os;
  return options;
}

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
}

template <typename F>
double real_seconds(F f) {
  const auto start = Clock::now();
  f();
  return seconds_between(start, Clock::now());
}

// Forms a two-rank group of `backend`, rank 0 through `os`; then each rank
// runs one all-reduce on `group_of(its world group)`, after `arm` has
// scripted rank 0's fault. Returns each rank's error.
std::vector<std::exception_ptr> allreduce_with_fault(
    const std::string& backend, FaultyOs& os, const std::function<void()>& arm,
    const std::function<std::shared_ptr<ProcessGroup>(const std::shared_ptr<ProcessGroup>&)>& group_of) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(kTimeout);
  std::vector<std::shared_ptr<ProcessGroup>> groups(2);
  testing::run_threads(2, [&](int rank) {
    groups[static_cast<std::size_t>(rank)] = group_of(init_process_group(options_for(rank, store, backend,
                                                                                      rank == 0 ? &os : nullptr)));
  });
  for (const auto& g : groups)
    if (!g) throw std::runtime_error("the group did not form");
  arm();
  return testing::run_threads(2, [&](int rank) {
    std::vector<float> v(1024, 1.0f);
    auto group = std::move(groups[static_cast<std::size_t>(rank)]);
    group->allreduce(view(std::span(v)))->wait();
  });
}

TEST(GroupFaults, ResetConnectionFailsBothRanksNamingThePeer) {
  FaultyOs os;
  std::vector<std::exception_ptr> errors;
  const double seconds = real_seconds([&] {
    errors = allreduce_with_fault(
        "tcp", os, [&] { os.fail(Call::recv, os.calls(Call::recv) + 1, ECONNRESET); },
        [](const std::shared_ptr<ProcessGroup>& world) { return world; });
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), PeerError);
  EXPECT_NE(message_of(errors[0]).find("lost rank 1: receiving failed (Connection reset by peer)"), std::string::npos)
      << message_of(errors[0]);
  // Rank 0 gives its group up, so rank 1 loses rank 0 at once.
  ASSERT_TRUE(errors[1]);
  EXPECT_NE(message_of(errors[1]).find("rank 0"), std::string::npos) << message_of(errors[1]);
  EXPECT_LT(seconds, 10.0);
}

// A sub-group makes its system calls through its parent's Os.
TEST(GroupFaults, SubGroupInheritsTheInjectedOs) {
  FaultyOs os;
  int recvs_before_subgroup = -1;
  const auto errors = allreduce_with_fault(
      "tcp", os, [&] { os.fail(Call::recv, os.calls(Call::recv) + 1, ECONNRESET); },
      [&](const std::shared_ptr<ProcessGroup>& world) {
        if (world->rank() == 0) recvs_before_subgroup = os.calls(Call::recv);
        return world->new_group({0, 1});
      });
  EXPECT_GT(os.calls(Call::recv), recvs_before_subgroup);  // the sub-group's connections used it
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), PeerError);
  EXPECT_NE(message_of(errors[0]).find("Connection reset by peer"), std::string::npos) << message_of(errors[0]);
}

// A full /dev/shm when rank 0 reserves its segment: forming the group fails
// on rank 0 with the cause and the fix, before any process could die of
// SIGBUS on first touch.
TEST(GroupFaults, FullSharedMemoryIsAConfigErrorWithTheFix) {
  FaultyOs os;
  os.fail_from(Call::allocate, 1, ENOSPC);
  auto store = std::make_shared<HashStore>();
  const auto errors = testing::run_threads(2, [&](int rank) {
    GroupOptions mine = options_for(rank, store, "shm", rank == 0 ? &os : nullptr);
    mine.connect_timeout = 2s;
    mine.timeout = 2s;
    init_process_group(mine);
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), ConfigError);
  const std::string what = message_of(errors[0]);
  EXPECT_NE(what.find("/dev/shm has no room"), std::string::npos) << what;
  EXPECT_NE(what.find("LOCKSTEP_BACKEND=tcp"), std::string::npos) << what;
  EXPECT_EQ(os.calls(Call::allocate), 1);
  // Rank 1 never sees rank 0's segment: its store wait ends at the timeout.
  EXPECT_TRUE(errors[1]);
}

}  // namespace
}  // namespace lockstep
