// A program started by `mpirun -np N` alone, with no MASTER_ADDR or
// MASTER_PORT: init_process_group finds the store through MPI (rank 0 hosts
// it) and forms the world with the backend LOCKSTEP_BACKEND names, or shm
// (all ranks on one host) when it names none. ctest runs this binary once per
// backend (tests/CMakeLists.txt), with those variables removed.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/socket.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

std::string expected_backend() {
  const char* requested = std::getenv("LOCKSTEP_BACKEND");
  return requested == nullptr || std::string(requested) == "auto" ? "shm" : requested;
}

void expect_a_working_world(ProcessGroup& pg) {
  EXPECT_EQ(pg.rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(pg.size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(pg.backend(), expected_backend());
  std::vector<std::int64_t> v(100000, pg.rank() + 1);
  pg.allreduce(view(std::span(v)))->wait();
  const std::int64_t n = pg.size();
  EXPECT_EQ(v.front(), n * (n + 1) / 2);
  EXPECT_EQ(v.back(), n * (n + 1) / 2);
  // The store is shared by all ranks.
  pg.store()->add("test/arrived", 1);
  pg.store()->wait({"test/arrived"}, std::chrono::seconds(30));
  pg.barrier()->wait();
  EXPECT_EQ(pg.store()->add("test/arrived", 0), n);
}

TEST(MpiBootstrap, FormsTheWorldWithoutMasterAddr) {
  ASSERT_EQ(std::getenv("MASTER_ADDR"), nullptr) << "this test is about running without MASTER_ADDR";
  ASSERT_EQ(std::getenv("MASTER_PORT"), nullptr);
  ASSERT_NE(std::getenv("OMPI_COMM_WORLD_RANK"), nullptr) << "run this test under mpirun";
  auto pg = init_process_group();
  expect_a_working_world(*pg);
  // Sub-groups use the same store and backend.
  auto backwards = pg->new_group([&] {
    std::vector<int> ranks;
    for (int q = pg->size() - 1; q >= 0; --q) ranks.push_back(q);
    return ranks;
  }());
  EXPECT_EQ(backwards->backend(), expected_backend());
  std::vector<float> v(10, 1.0f);
  backwards->allreduce(view(std::span(v)))->wait();
  EXPECT_EQ(v[9], static_cast<float>(pg->size()));
}

// MPI can be initialised only once per process: lockstep finalises it at
// exit, not when a group ends, so a program can form a world again.
TEST(MpiBootstrap, AWorldCanBeFormedAgainAfterTheFirstIsDestroyed) {
  for (int round = 0; round < 2; ++round) {
    auto pg = init_process_group();
    expect_a_working_world(*pg);
  }
}

// Rank 0 cannot host the store (the port MASTER_PORT names is taken): every
// rank fails with rank 0's reason, at once, instead of waiting for a store
// that never comes. (Only rank 0 reads MASTER_PORT here; the others learn
// the port from rank 0.)
TEST(MpiBootstrap, ARank0ThatCannotHostTheStoreFailsEveryRankWithItsReason) {
  const int rank = std::atoi(std::getenv("OMPI_COMM_WORLD_RANK"));
  Socket holder;
  std::string port = "29500";
  if (rank == 0) {
    holder = listen_tcp("127.0.0.1", 0);
    port = std::to_string(local_port(holder.fd()));
  }
  ::setenv("MASTER_PORT", port.c_str(), 1);
  const auto start = Clock::now();
  try {
    init_process_group();
    ADD_FAILURE() << "a world formed although rank 0 could not host the store";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 could not host the rendezvous store"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_between(start, Clock::now()), 10.0);
  ::unsetenv("MASTER_PORT");
}

}  // namespace
}  // namespace lockstep
