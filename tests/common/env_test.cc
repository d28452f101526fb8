// Typed environment reads, Config::from_environment, and the launcher
// resolution over them.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/launch_env.h"
#include "common/env.h"
#include "common/log.h"
#include "lockstep/config.h"

namespace lockstep {
namespace {

// Sets variables for one test and restores the previous values.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      if (v) ::setenv(k, v, 1); else ::unsetenv(k);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1); else ::unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Clears every launcher variable resolve_launch looks at.
ScopedEnv clean_launcher_env() {
  return ScopedEnv({{"RANK", nullptr}, {"WORLD_SIZE", nullptr}, {"LOCAL_RANK", nullptr},
                    {"LOCAL_WORLD_SIZE", nullptr}, {"MASTER_ADDR", nullptr}, {"MASTER_PORT", nullptr},
                    {"OMPI_COMM_WORLD_RANK", nullptr}, {"OMPI_COMM_WORLD_SIZE", nullptr},
                    {"SLURM_PROCID", nullptr}, {"SLURM_NTASKS", nullptr}, {"SLURM_JOB_ID", nullptr},
                    {"SLURM_STEP_NODELIST", nullptr}, {"SLURM_JOB_NODELIST", nullptr},
                    {"SLURMD_NODENAME", nullptr}});
}

TEST(Env, ParsesSecondsAndRejectsGarbage) {
  ScopedEnv env({{"LOCKSTEP_TEST_SECONDS", "1.5"}, {"LOCKSTEP_TEST_BAD", "soon"}});
  EXPECT_EQ(env_seconds("LOCKSTEP_TEST_SECONDS"), Duration(1500));
  EXPECT_THROW(env_seconds("LOCKSTEP_TEST_BAD"), ConfigError);
  EXPECT_FALSE(env_seconds("LOCKSTEP_TEST_UNSET").has_value());
}

// Each value must be refused before it is converted: 1e300 used to overflow
// into a negative timeout, and 0.0001 to round down to 0 ms.
TEST(Env, TimeoutsOutsideTheAcceptedRangeAreClearErrors) {
  for (const char* value : {"1e300", "0", "0.0001", "-5", "inf", "nan", "700000"}) {
    ScopedEnv env({{"LOCKSTEP_TIMEOUT", value}});
    try {
      env_seconds("LOCKSTEP_TIMEOUT");
      ADD_FAILURE() << "LOCKSTEP_TIMEOUT=" << value << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("LOCKSTEP_TIMEOUT='") + value + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("from 0.001 to 604800"), std::string::npos) << what;
    }
  }
  ScopedEnv env({{"LOCKSTEP_TIMEOUT", "604800"}});
  EXPECT_EQ(env_seconds("LOCKSTEP_TIMEOUT"), Duration(604800 * 1000));
}

TEST(Env, BoundedIntegersNameTheVariableTheValueAndTheRange) {
  ScopedEnv env({{"LOCKSTEP_TEST_INT", "4294967297"}, {"LOCKSTEP_TEST_WORD", "many"}, {"LOCKSTEP_TEST_OK", "7"}});
  EXPECT_EQ(env_int("LOCKSTEP_TEST_OK", 1, 7), 7);
  try {
    env_int("LOCKSTEP_TEST_INT", 1, 100);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_TEST_INT='4294967297' is out of range; set it to a whole number "
                                         "from 1 to 100"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(env_int("LOCKSTEP_TEST_WORD", 1, 100), ConfigError);
  EXPECT_FALSE(env_int("LOCKSTEP_TEST_UNSET", 1, 100).has_value());
}

TEST(Env, ConfigFromEnvironmentReadsTheProcessEnvironment) {
  {
    ScopedEnv env({{"LOCKSTEP_LOG_LEVEL", "debug"}});
    EXPECT_EQ(Config::from_environment().log_level, LogLevel::debug);
  }
  ScopedEnv env({{"LOCKSTEP_LOG_LEVEL", "loud"}});
  EXPECT_THROW(Config::from_environment().log_level, ConfigError);
}

TEST(LaunchEnv, NoLauncherMeansAWorldOfOne) {
  auto clean = clean_launcher_env();
  const auto info = resolve_launch({}, Config::from_environment());
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.source, LaunchSource::none);
}

TEST(LaunchEnv, TorchrunVariables) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  const auto info = resolve_launch({}, Config::from_environment());
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
}

TEST(LaunchEnv, OpenMpiVariables) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}});
  const auto info = resolve_launch({}, Config::from_environment());
  EXPECT_EQ(info.source, LaunchSource::open_mpi);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
}

TEST(LaunchEnv, SlurmVariables) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
                 {"SLURM_TASKS_PER_NODE", "2(x2),4"}, {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "1234"}});
  const auto info = resolve_launch({}, Config::from_environment());
  EXPECT_EQ(info.source, LaunchSource::slurm);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x2),4", 1), 2);
}

// The program's rank and size win over the launcher's variables, whatever
// they say: torch.distributed hands a backend the group's rank and size
// with WORLD_SIZE (and maybe not RANK) in the environment, and a subgroup's
// numbers never match the job's.
TEST(LaunchEnv, RankAndSizeGivenByTheProgramWinOverTheLaunchersVariables) {
  auto clean = clean_launcher_env();
  GroupOptions options;
  options.rank = 2;
  options.world_size = 3;
  options.master_addr = "127.0.0.1";
  options.master_port = 29500;
  {
    ScopedEnv env({{"WORLD_SIZE", "2"}});  // half a pair: fatal without options
    EXPECT_THROW(resolve_launch({}, Config::from_environment()), ConfigError);
    const auto info = resolve_launch(options, Config::from_environment());
    EXPECT_EQ(info.rank, 2);
    EXPECT_EQ(info.world_size, 3);
    EXPECT_EQ(info.source, LaunchSource::options);
    EXPECT_NE(info.ignored_variables.find("WORLD_SIZE is set but RANK is not"), std::string::npos)
        << info.ignored_variables;
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "6"}, {"LOCAL_WORLD_SIZE", "8"}});
    const auto info = resolve_launch(options, Config::from_environment());
    EXPECT_EQ(info.rank, 2);
    EXPECT_EQ(info.world_size, 3);
    // The job's 8 ranks on a host do not fit this group of 3: its own numbers.
    EXPECT_EQ(info.local_rank, 2);
    EXPECT_EQ(info.local_world_size, 3);
    EXPECT_TRUE(info.ignored_variables.empty());
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}});
    const auto info = resolve_launch(options, Config::from_environment());
    EXPECT_EQ(info.local_rank, 0);  // what fits is taken
    EXPECT_EQ(info.local_world_size, 1);
  }
}

void expect_config_error(const GroupOptions& options, const std::string& fragment) {
  try {
    resolve_launch(options, Config::from_environment());
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// Under mpirun alone there is no MASTER_ADDR: init_process_group then finds
// the store through MPI (comm/mpi/bootstrap.h), so this is not an error.
TEST(LaunchEnv, OpenMpiWithoutMasterAddrIsLeftToTheMpiBootstrap) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  const auto info = resolve_launch({}, Config::from_environment());
  EXPECT_EQ(info.source, LaunchSource::open_mpi);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.local_world_size, 3);
  EXPECT_EQ(info.master_addr, "");
  EXPECT_EQ(info.master_port, -1);
  // RANK/WORLD_SIZE take precedence, and they still need MASTER_ADDR.
  ScopedEnv torchrun({{"RANK", "0"}, {"WORLD_SIZE", "3"}});
  expect_config_error({}, "MASTER_ADDR is not set");
}

// srun alone: every task finds the store on the step's first node; task 0
// placed elsewhere is told so at once, naming both nodes, instead of the
// others timing out.
TEST(LaunchEnv, SlurmTasksFindTheStoreOnTheFirstNodeAndTaskZeroMustRunThere) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "77"},
                 {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURMD_NODENAME", "n1"}});
  const auto info = resolve_launch({}, Config::from_environment());
  EXPECT_EQ(info.master_addr, "n1");
  EXPECT_EQ(info.master_port, 15077);

  ScopedEnv task0({{"SLURM_PROCID", "0"}, {"SLURMD_NODENAME", "n2"}});
  expect_config_error({}, "rank 0 runs on n2 (SLURMD_NODENAME), but the other tasks look for its store on n1");
  ScopedEnv given({{"MASTER_ADDR", "n2"}});
  EXPECT_EQ(resolve_launch({}, Config::from_environment()).master_addr, "n2");
}

TEST(LaunchEnv, MissingMasterAddrIsAClearError) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  expect_config_error({}, "MASTER_ADDR is not set");
}

TEST(LaunchEnv, RankOutsideWorldIsAClearError) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}});
  expect_config_error({}, "rank 4 is outside the world of 4 ranks");
}

TEST(LaunchEnv, ZeroWorldSizeIsAClearError) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "0"}});
  expect_config_error({}, "WORLD_SIZE='0' is out of range");
}

// Values that used to wrap when narrowed to int: 4294967297 became a world
// of 1, and 2^32 + 29500 the port 29500.
TEST(LaunchEnv, HugeWorldSizesRanksAndPortsAreRefusedNotTruncated) {
  auto clean = clean_launcher_env();
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "4294967297"}});
    expect_config_error({}, "WORLD_SIZE='4294967297' is out of range; set it to a whole number from 1 to 1048576");
  }
  {
    ScopedEnv env({{"RANK", "4294967296"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}});
    expect_config_error({}, "RANK='4294967296' is out of range");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4294967298"}, {"MASTER_ADDR", "x"},
                   {"MASTER_PORT", "1"}});
    expect_config_error({}, "LOCAL_WORLD_SIZE='4294967298' is out of range");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}, {"MASTER_PORT", "4294996796"}});
    expect_config_error({}, "MASTER_PORT='4294996796' is out of range; set it to a whole number from 1 to 65535");
  }
}

TEST(LaunchEnv, AZeroOrOverflowingTimeoutIsAClearError) {
  auto clean = clean_launcher_env();
  {
    ScopedEnv env({{"LOCKSTEP_TIMEOUT", "1e300"}});
    expect_config_error({}, "LOCKSTEP_TIMEOUT='1e300'");
  }
  {
    ScopedEnv env({{"LOCKSTEP_TIMEOUT", "0.0001"}});
    expect_config_error({}, "LOCKSTEP_TIMEOUT='0.0001'");
  }
  GroupOptions zero;
  zero.timeout = Duration(0);
  EXPECT_THROW(resolve_launch(zero, Config::from_environment()), InvalidArgument);
  GroupOptions forever;
  forever.connect_timeout = Duration::max();
  EXPECT_THROW(resolve_launch(forever, Config::from_environment()), InvalidArgument);
}

TEST(LaunchEnv, HalfAPairIsAClearError) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"RANK", "0"}});
  expect_config_error({}, "WORLD_SIZE is not");
}

TEST(LaunchEnv, NonNumericRankIsAClearError) {
  auto clean = clean_launcher_env();
  ScopedEnv env({{"RANK", "first"}, {"WORLD_SIZE", "2"}});
  expect_config_error({}, "RANK='first' is not an integer");
}

}  // namespace
}  // namespace lockstep
