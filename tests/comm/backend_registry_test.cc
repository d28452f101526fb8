// The registry comm's core forms groups through (comm/backend_registry.h):
// every backend by name, a clear error for an unknown one, and MPI's
// process-wide hooks reached through the registration rather than by
// including the mpi folder.
#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "comm/backend_registry.h"
#include "harness/thread_world.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

TEST(BackendRegistry, ListsEveryBackendFolderOnce) {
  std::vector<std::string> names;
  for (const auto& backend : registered_backends()) {
    names.emplace_back(backend.name);
    EXPECT_NE(backend.make, nullptr) << backend.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tcp", "shm", "hier", "mpi", "nccl"}));
}

TEST(BackendRegistry, AnUnknownNameIsAConfigErrorListingTheChoices) {
  try {
    registered_backend("gloo");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "unknown backend 'gloo'; choose auto, tcp, shm, hier, mpi or nccl");
  }
}

TEST(BackendRegistry, OnlyMpirunsJobsFormTheirStoreThroughABackendsRuntime) {
  const BackendRegistration* mpirun = store_bootstrap_for(LaunchSource::open_mpi);
  ASSERT_NE(mpirun, nullptr);
  EXPECT_EQ(mpirun->name, "mpi");
  EXPECT_EQ(store_bootstrap_for(LaunchSource::none), nullptr);
  EXPECT_EQ(store_bootstrap_for(LaunchSource::torchrun), nullptr);
}

// No group of this process used MPI, so a failure must not turn the end of
// the process into an MPI_Abort.
TEST(BackendRegistry, AFailedGroupDoesNotEndAJobThatLockstepDidNotStartMpiFor) {
  note_group_failed(std::make_exception_ptr(PeerError("rank 1 is gone")));
  EXPECT_FALSE(job_ends_at_exit());
}

TEST(BackendRegistry, GroupsFormWithEachHostBackendByName) {
  for (const std::string name : {"tcp", "shm"}) {
    testing::ThreadWorld world(2, name);
    world.run([](int rank, ProcessGroup& pg) {
      std::vector<float> v{static_cast<float>(rank + 1)};
      pg.allreduce(view(std::span(v)))->wait();
      EXPECT_EQ(v[0], 3.0f);
    });
    EXPECT_EQ(world.group(0).backend(), name);
  }
}

}  // namespace
}  // namespace lockstep
