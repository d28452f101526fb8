// main() of the test binaries that ctest starts under mpirun: every MPI rank
// runs the same tests, in the same order, so each test is one collective
// program. A rank dies with mpirun (PR_SET_PDEATHSIG), so a test run that
// ctest or mpirun cuts short never leaves ranks behind; ranks other than 0
// print only failures, so the log reads like one run. Not thread-safe (main).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 1;  // mpirun is already gone
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank != nullptr && std::atoi(rank) != 0) ::testing::GTEST_FLAG(brief) = true;  // before InitGoogleTest reads it
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
