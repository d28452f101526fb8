// Config::parse: every variable read into its typed field, every bad value a
// ConfigError that names the variable, the value and what is accepted.
// Variables come from a map, so these tests never touch the environment.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>

#include "common/env_vars.h"
#include "lockstep/config.h"
#include "lockstep/error.h"

namespace lockstep {
namespace {

using Vars = std::map<std::string, std::string>;

Config parse(const Vars& vars) {
  return Config::parse([&vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(Config, NothingSetGivesTheDefaults) {
  const Config c = parse({});
  EXPECT_EQ(c.launcher.source, LaunchSource::none);
  EXPECT_EQ(c.launcher.world_size, 1);
  EXPECT_EQ(c.backend, "auto");
  EXPECT_FALSE(c.timeout.has_value());
  EXPECT_FALSE(c.connect_timeout.has_value());
  EXPECT_EQ(c.log_level, LogLevel::warn);
  EXPECT_EQ(c.debug, DebugLevel::off);
  EXPECT_EQ(c.run_name, "job");
  EXPECT_EQ(c.restart_count, 0);
  EXPECT_EQ(c.on_rank_failure, "");
  EXPECT_TRUE(c.mpi_abort_on_failure);
  EXPECT_FALSE(c.started_by_mpirun);
  EXPECT_FALSE(c.tcp_small_bytes.has_value());
  EXPECT_EQ(c.shm_streaming_stores, ShmStreamingStores::automatic);
  EXPECT_EQ(c.shm_ordinary_path, ShmOrdinaryPath::automatic);
  EXPECT_TRUE(c.trace_prefix.empty());
}

TEST(Config, EveryVariableReachesItsField) {
  const Config c = parse({{env::kBackend, "tcp"},
                          {env::kTimeout, "2.5"},
                          {env::kConnectTimeout, "7"},
                          {env::kLogLevel, "DEBUG"},
                          {env::kStoreToken, "secret"},
                          {env::kStoreAddr, "10.0.0.1"},
                          {env::kStorePort, "29400"},
                          {env::kRunId, "exp1"},
                          {env::kRestartCount, "3"},
                          {env::kSocketAddr, "10.0.0.7"},
                          {env::kHostId, "pretend-a"},
                          {env::kTcpSmallBytes, "65536"},
                          {env::kShmOneShotBytes, "4096"},
                          {env::kShmChunkBytes, "8192"},
                          {env::kShmSpinMicros, "50"},
                          {env::kShmTag, "job-1"},
                          {env::kShmSingleCopyBytes, "1048576"},
                          {env::kShmStreamingStores, "always"},
                          {env::kShmOrdinaryPath, "single-copy"},
                          {env::kOnRankFailure, "continue"},
                          {env::kMaxReplacements, "2"},
                          {env::kDebug, "detail"},
                          {env::kTrace, "/tmp/trace"},
                          {env::kStats, "/tmp/stats"},
                          {env::kFlightDir, "/tmp/flight"},
                          {env::kWatchdogSettle, "0.25"},
                          {env::kStallWarning, "9"},
                          {env::kMpiMaxCount, "1000"},
                          {env::kMpiAbortOnFailure, "0"},
                          {env::kMasterAddr, "n0"},
                          {env::kMasterPort, "29500"},
                          {env::kOmpiSize, "2"},
                          {env::kOmpiRank, "1"}});
  EXPECT_EQ(c.backend, "tcp");
  EXPECT_EQ(c.timeout, Duration(2500));
  EXPECT_EQ(c.connect_timeout, Duration(7000));
  EXPECT_EQ(c.log_level, LogLevel::debug);
  EXPECT_EQ(c.store_token, "secret");
  EXPECT_TRUE(c.store_hosted);
  EXPECT_EQ(c.store_addr, "10.0.0.1");
  EXPECT_EQ(c.store_port, 29400);
  EXPECT_EQ(c.run_name, "exp1");
  EXPECT_EQ(c.restart_count, 3);
  EXPECT_EQ(c.host_id, "pretend-a");
  EXPECT_EQ(c.socket_addr, "10.0.0.7");
  EXPECT_EQ(c.tcp_small_bytes, 65536u);
  EXPECT_EQ(c.shm_one_shot_bytes, 4096u);
  EXPECT_EQ(c.shm_chunk_bytes, 8192u);
  EXPECT_EQ(c.shm_spin_micros, 50);
  EXPECT_EQ(c.shm_tag, "job-1");
  EXPECT_EQ(c.shm_single_copy_bytes, 1048576u);
  EXPECT_EQ(c.shm_streaming_stores, ShmStreamingStores::always);
  EXPECT_EQ(c.shm_ordinary_path, ShmOrdinaryPath::single_copy);
  EXPECT_EQ(c.on_rank_failure, "continue");
  EXPECT_EQ(c.max_replacements, 2);
  EXPECT_EQ(c.debug, DebugLevel::detail);
  EXPECT_EQ(c.trace_prefix, "/tmp/trace");
  EXPECT_EQ(c.stats_prefix, "/tmp/stats");
  EXPECT_EQ(c.flight_dir, "/tmp/flight");
  EXPECT_EQ(c.watchdog_settle, Duration(250));
  EXPECT_EQ(c.stall_warning, Duration(9000));
  EXPECT_EQ(c.mpi_max_count, 1000u);
  EXPECT_FALSE(c.mpi_abort_on_failure);
  EXPECT_EQ(c.master_addr, "n0");
  EXPECT_EQ(c.master_port, 29500);
  EXPECT_TRUE(c.started_by_mpirun);
  EXPECT_EQ(c.launcher.source, LaunchSource::open_mpi);
  EXPECT_EQ(c.launcher.rank, 1);
  EXPECT_EQ(c.launcher.world_size, 2);
}

// torchrun's names stand in for lockstep's own when those are unset.
TEST(Config, TorchelasticRunIdAndRestartCountAreTheFallbacks) {
  const Config c = parse({{env::kTorchelasticRunId, "abc"}, {env::kTorchelasticRestartCount, "2"}});
  EXPECT_EQ(c.run_name, "abc");
  EXPECT_EQ(c.torchelastic_run_id, "abc");
  EXPECT_EQ(c.restart_count, 2);
  const Config own = parse({{env::kTorchelasticRunId, "abc"}, {env::kRunId, "mine"}, {env::kRestartCount, "0"},
                            {env::kTorchelasticRestartCount, "2"}});
  EXPECT_EQ(own.run_name, "mine");
  EXPECT_EQ(own.restart_count, 0);
}

TEST(Config, EmptyValuesCountAsUnset) {
  const Config c = parse({{env::kTimeout, ""}, {env::kBackend, ""}, {env::kRank, ""}, {env::kWorldSize, ""}});
  EXPECT_FALSE(c.timeout.has_value());
  EXPECT_EQ(c.backend, "auto");
  EXPECT_EQ(c.launcher.source, LaunchSource::none);
}

TEST(Config, LauncherOrderIsTorchrunThenOpenMpiThenSlurm) {
  EXPECT_EQ(parse({{env::kRank, "0"}, {env::kWorldSize, "2"}, {env::kOmpiRank, "1"}, {env::kOmpiSize, "2"}})
                .launcher.source,
            LaunchSource::torchrun);
  const Config slurm = parse({{env::kSlurmProcId, "5"}, {env::kSlurmNtasks, "8"}, {env::kSlurmLocalId, "1"},
                              {env::kSlurmNodeId, "2"}, {env::kSlurmTasksPerNode, "2(x2),4"}});
  EXPECT_EQ(slurm.launcher.source, LaunchSource::slurm);
  EXPECT_EQ(slurm.launcher.local_rank, 1);
  EXPECT_EQ(slurm.launcher.local_world_size, 4);
  EXPECT_EQ(to_string(LaunchSource::open_mpi), "Open MPI");
}

// Under srun, a task finds the store without MASTER_ADDR or MASTER_PORT:
// task 0 runs on the step's first node, and the port comes from the job id.
TEST(Config, SlurmTasksLookForTheStoreOnTheStepsFirstNode) {
  const Vars srun = {{env::kSlurmProcId, "3"},
                     {env::kSlurmNtasks, "8"},
                     {env::kSlurmJobId, "4123456"},
                     {env::kSlurmStepNodeList, "gpu[07-08]"},
                     {env::kSlurmJobNodeList, "gpu[05-08]"},
                     {env::kSlurmdNodeName, "gpu08"}};
  const Config c = parse(srun);
  EXPECT_EQ(c.master_addr, "gpu07");
  EXPECT_EQ(c.master_port, 18456);
  EXPECT_EQ(c.slurm_node_name, "gpu08");
  EXPECT_NE(c.master_addr_from.find("SLURM_STEP_NODELIST=gpu[07-08]"), std::string::npos) << c.master_addr_from;
  EXPECT_NE(c.master_port_from.find("SLURM_JOB_ID=4123456"), std::string::npos) << c.master_port_from;

  Vars job_only = srun;
  job_only.erase(env::kSlurmStepNodeList);
  EXPECT_EQ(parse(job_only).master_addr, "gpu05");

  Vars given = srun;
  given[env::kMasterAddr] = "10.1.2.3";
  given[env::kMasterPort] = "29500";
  const Config g = parse(given);
  EXPECT_EQ(g.master_addr, "10.1.2.3");
  EXPECT_EQ(g.master_port, 29500);
  EXPECT_TRUE(g.master_addr_from.empty());

  // RANK/WORLD_SIZE come first (torchrun inside an allocation): Slurm's
  // node list is then not the rendezvous.
  Vars torchrun = srun;
  torchrun[env::kRank] = "0";
  torchrun[env::kWorldSize] = "2";
  EXPECT_TRUE(parse(torchrun).master_addr.empty());
}

TEST(Config, SlurmHostListsNameTheirFirstHost) {
  const std::pair<const char*, const char*> cases[] = {
      {"node01", "node01"},          {"node[01-04]", "node01"},         {"node[3,1-2]", "node3"},
      {"gpu5,cpu[1-2]", "gpu5"},     {"rack[2-3]-n[07,09]", "rack2-n07"}, {"a[010-012]b", "a010b"},
  };
  for (const auto& [list, first] : cases) {
    Vars v = {{env::kSlurmProcId, "0"}, {env::kSlurmNtasks, "2"}, {env::kSlurmJobNodeList, list}};
    EXPECT_EQ(parse(v).master_addr, first) << list;
  }
  for (const char* bad : {"node[01-04", "node[]", "node[x-y]", ",node1"}) {
    try {
      parse({{env::kSlurmProcId, "0"}, {env::kSlurmNtasks, "2"}, {env::kSlurmJobNodeList, bad}});
      ADD_FAILURE() << bad << " was taken";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string("SLURM_JOB_NODELIST='") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("set MASTER_ADDR"), std::string::npos) << what;
    }
    // As the message says: with MASTER_ADDR given, the list is not read.
    EXPECT_EQ(parse({{env::kSlurmProcId, "0"}, {env::kSlurmNtasks, "2"}, {env::kSlurmJobNodeList, bad},
                     {env::kMasterAddr, "10.1.2.3"}})
                  .master_addr,
              "10.1.2.3")
        << bad;
  }
}

// A launcher's store is one address and one port; half of it is a mistake,
// not a reason to fall back to MASTER_ADDR (the program's own, under
// `lockstep run`).
TEST(Config, TheLaunchersStoreNeedsBothAddressAndPort) {
  for (const auto& half : {std::pair{env::kStoreAddr, "10.0.0.1"}, std::pair{env::kStorePort, "29400"}}) {
    try {
      parse({{half.first, half.second}});
      ADD_FAILURE() << half.first << " alone was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("LOCKSTEP_STORE_ADDR and LOCKSTEP_STORE_PORT go together"), std::string::npos)
          << e.what();
    }
  }
}

struct BadValue {
  const char* name;
  const char* value;
  const char* accepted;  // a fragment of the message saying what is accepted
};

// Each bad value alone, so the error can only come from that variable.
TEST(Config, EachBadValueIsAConfigErrorNamingTheVariableTheValueAndWhatIsAccepted) {
  const BadValue cases[] = {
      {env::kLogLevel, "loud", "use error, warn, info, debug or trace"},
      {env::kDebug, "verbose", "use OFF, INFO or DETAIL"},
      {env::kTimeout, "soon", "from 0.001 to 604800"},
      {env::kTimeout, "1e300", "from 0.001 to 604800"},
      {env::kConnectTimeout, "0", "from 0.001 to 604800"},
      {env::kWatchdogSettle, "-1", "from 0.001 to 604800"},
      {env::kStallWarning, "inf", "from 0.001 to 604800"},
      {env::kStorePort, "70000", "from 1 to 65535"},
      {env::kMpiAbortOnFailure, "2", "use 1 or 0"},
      {env::kShmOrdinaryPath, "always", "use auto, slots or single-copy"},
      {env::kOnRankFailure, "stop", "use restart or continue"},
      {env::kRestartCount, "-1", "from 0 to 2147483647"},
      {env::kMaxReplacements, "-2", "from 0 to 2147483647"},
      {env::kTorchelasticRestartCount, "x", "from 0 to 2147483647"},
      {env::kTcpSmallBytes, "2000000000", "from 0 to 1073741824"},
      {env::kShmOneShotBytes, "lots", "from 0 to 1073741824"},
      {env::kShmChunkBytes, "-64", "from 0 to 1073741824"},
      {env::kShmSpinMicros, "2000000", "from 0 to 1000000"},
      {env::kShmSingleCopyBytes, "1e9", "from 0 to 1099511627776"},
      {env::kShmStreamingStores, "sometimes", "use auto, always or never"},
      {env::kMpiMaxCount, "0", "from 1 to 2147483647"},
      {env::kMasterPort, "4294996796", "from 1 to 65535"},
      {env::kLocalRank, "-1", "from 0 to 1048575"},
      {env::kLocalWorldSize, "4294967298", "from 1 to 1048576"},
      {env::kWorldSize, "0", "from 1 to 1048576"},
      {env::kOmpiRank, "first", "from 0 to 1048575"},
      {env::kSlurmNtasks, "many", "from 1 to 1048576"},
  };
  for (const auto& bad : cases) {
    Vars vars = {{bad.name, bad.value}};
    // A launcher variable is read only with its partner set.
    if (std::string(bad.name) == env::kWorldSize) vars[env::kRank] = "0";
    if (std::string(bad.name) == env::kOmpiRank) vars[env::kOmpiSize] = "2";
    if (std::string(bad.name) == env::kSlurmNtasks) vars[env::kSlurmProcId] = "0";
    try {
      // A launcher's variables are refused when the placement is read
      // (see LauncherVariablesAreRefusedOnlyWhereThePlacementIsRead).
      parse(vars).placement();
      ADD_FAILURE() << bad.name << "='" << bad.value << "' was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(bad.name) + "='" + bad.value + "'"), std::string::npos) << what;
      EXPECT_NE(what.find(bad.accepted), std::string::npos) << what;
    }
  }
}

TEST(Config, HalfALauncherPairOrARankOutsideTheWorldIsAClearError) {
  EXPECT_THROW(parse({{env::kRank, "0"}}).placement(), ConfigError);
  try {
    parse({{env::kRank, "4"}, {env::kWorldSize, "4"}}).placement();
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 4 is outside the world of 4 ranks (RANK=4, WORLD_SIZE=4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse({{env::kSlurmProcId, "0"}, {env::kSlurmNtasks, "2"}, {env::kSlurmNodeId, "3"},
                      {env::kSlurmTasksPerNode, "1(x2)"}})
                   .placement(),
               ConfigError);
}

// torch.distributed's test harness, like many scripts, passes rank= and
// world_size= to init_process_group with only WORLD_SIZE exported: parsing
// must not fail then, since a group given its rank never reads them.
TEST(Config, LauncherVariablesAreRefusedOnlyWhereThePlacementIsRead) {
  const Config c = parse({{env::kWorldSize, "2"}, {env::kLocalRank, "0"}, {env::kLogLevel, "info"}});
  EXPECT_NE(c.launcher_problem.find("WORLD_SIZE is set but RANK is not"), std::string::npos) << c.launcher_problem;
  EXPECT_EQ(c.launcher.source, LaunchSource::none);
  EXPECT_FALSE(c.local_rank.has_value());
  EXPECT_EQ(c.log_level, LogLevel::info);  // the rest is read as usual
  EXPECT_THROW(c.placement(), ConfigError);
  // Other variables' bad values are refused at once, as before.
  EXPECT_THROW(parse({{env::kWorldSize, "2"}, {env::kLogLevel, "loud"}}), ConfigError);
}

// LOCAL_RANK=5 with LOCAL_WORLD_SIZE=1 used to be accepted, and the rank
// pinned (or given a GPU) by it. Each contradiction names both variables
// and their values.
TEST(Config, LocalVariablesThatContradictEachOtherOrTheWorldAreRefused) {
  const std::pair<Vars, const char*> cases[] = {
      {{{env::kRank, "0"}, {env::kWorldSize, "2"}, {env::kLocalRank, "5"}, {env::kLocalWorldSize, "1"}},
       "LOCAL_RANK=5 is not below LOCAL_WORLD_SIZE=1"},
      {{{env::kRank, "0"}, {env::kWorldSize, "2"}, {env::kLocalRank, "1"}, {env::kLocalWorldSize, "1"}},
       "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1: the ranks on a host are numbered 0..0"},
      {{{env::kRank, "0"}, {env::kWorldSize, "2"}, {env::kLocalRank, "0"}, {env::kLocalWorldSize, "8"}},
       "LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=2"},
      {{{env::kRank, "0"}, {env::kWorldSize, "2"}, {env::kLocalRank, "2"}}, "LOCAL_RANK=2 is not below WORLD_SIZE=2"},
      // Without a launcher's RANK, the pair still places a rank given in GroupOptions.
      {{{env::kLocalRank, "5"}, {env::kLocalWorldSize, "1"}}, "LOCAL_RANK=5 is not below LOCAL_WORLD_SIZE=1"},
      {{{env::kOmpiRank, "1"}, {env::kOmpiSize, "4"}, {env::kOmpiLocalRank, "2"}, {env::kOmpiLocalSize, "2"}},
       "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"},
      {{{env::kSlurmProcId, "1"}, {env::kSlurmNtasks, "4"}, {env::kSlurmLocalId, "3"}, {env::kSlurmNodeId, "0"},
        {env::kSlurmTasksPerNode, "2(x2)"}},
       "SLURM_LOCALID=3 is not below SLURM_TASKS_PER_NODE=2(x2) (2 on node SLURM_NODEID=0)"},
  };
  for (const auto& [vars, message] : cases) {
    try {
      parse(vars).placement();
      ADD_FAILURE() << message << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // What agrees is taken as it is.
  const Config c = parse({{env::kRank, "3"}, {env::kWorldSize, "4"}, {env::kLocalRank, "1"}, {env::kLocalWorldSize, "2"}});
  EXPECT_EQ(c.launcher.local_rank, 1);
  EXPECT_EQ(c.launcher.local_world_size, 2);
}

}  // namespace
}  // namespace lockstep
