// A Config given in GroupOptions is what a group uses, and then nothing
// below init_process_group reads the environment: every variable lockstep
// knows is set to a value it refuses, and groups still form, run and honour
// the given settings.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/env_vars.h"
#include "harness/thread_world.h"
#include "lockstep/config.h"
#include "lockstep/process_group.h"

namespace lockstep {
namespace {

// Sets variables for one test and restores them after.
class ScopedVariables {
 public:
  explicit ScopedVariables(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(name, value, 1);
    }
  }
  ~ScopedVariables() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1); else ::unsetenv(name.c_str());
    }
  }
  ScopedVariables(const ScopedVariables&) = delete;
  ScopedVariables& operator=(const ScopedVariables&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A value each variable refuses, or one that would break the group if used.
ScopedVariables hostile_environment() {
  return ScopedVariables({{env::kRank, "garbage"},          {env::kWorldSize, "garbage"},
                          {env::kLocalRank, "garbage"},     {env::kLocalWorldSize, "garbage"},
                          {env::kMasterAddr, "no.such.host.invalid"},
                          {env::kMasterPort, "garbage"},    {env::kOmpiRank, "garbage"},
                          {env::kOmpiSize, "garbage"},      {env::kSlurmProcId, "garbage"},
                          {env::kSlurmNtasks, "garbage"},   {env::kLogLevel, "garbage"},
                          {env::kBackend, "garbage"},       {env::kTimeout, "garbage"},
                          {env::kConnectTimeout, "garbage"}, {env::kStorePort, "garbage"},
                          {env::kRestartCount, "garbage"},  {env::kSocketAddr, "256.256.256.256"},
                          {env::kTcpSmallBytes, "garbage"}, {env::kShmOneShotBytes, "garbage"},
                          {env::kShmChunkBytes, "garbage"}, {env::kShmSpinMicros, "garbage"},
                          {env::kShmTag, "not a tag!"},     {env::kShmSingleCopyBytes, "garbage"},
                          {env::kDebug, "garbage"},         {env::kTrace, "/nonexistent/lockstep/trace"},
                          {env::kStats, "/nonexistent/lockstep/stats"},
                          {env::kFlightDir, "/nonexistent/lockstep/flight"},
                          {env::kWatchdogSettle, "garbage"}, {env::kStallWarning, "garbage"},
                          {env::kMpiMaxCount, "garbage"},   {env::kMpiAbortOnFailure, "garbage"}});
}

class ExplicitConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(ExplicitConfig, IsHonouredWhileTheEnvironmentHoldsOnlyBadValues) {
  const std::string backend = GetParam();
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto hostile = hostile_environment();
  ASSERT_THROW(Config::from_environment(), ConfigError);  // the environment really is unusable

  Config config;
  config.backend = backend;
  config.timeout = std::chrono::seconds(20);
  config.connect_timeout = std::chrono::seconds(20);
  config.trace_prefix = (dir / backend).string();
  config.shm_chunk_bytes = 4096;
  const int size = 2;
  auto store = std::make_shared<HashStore>();
  std::vector<std::vector<float>> results(size);
  auto errors = testing::run_threads(size, [&](int rank) {
    GroupOptions options;
    options.config = config;
    options.rank = rank;
    options.world_size = size;
    options.store = store;
    auto pg = init_process_group(options);
    EXPECT_EQ(pg->backend(), backend);
    EXPECT_EQ(pg->timeout(), std::chrono::seconds(20));
    EXPECT_EQ(pg->config().trace_prefix, config.trace_prefix);
    // Larger than a chunk, so shm pipelines it in the configured chunks.
    std::vector<float> data(10000, static_cast<float>(rank + 1));
    pg->allreduce(view(std::span(data)), ReduceOp::sum)->wait();
    results[static_cast<std::size_t>(rank)] = std::move(data);
  });
  for (int r = 0; r < size; ++r) {
    if (errors[static_cast<std::size_t>(r)]) {
      try {
        std::rethrow_exception(errors[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        FAIL() << "rank " << r << ": " << e.what();
      }
    }
    EXPECT_EQ(results[static_cast<std::size_t>(r)], std::vector<float>(10000, 3.0f)) << "rank " << r;
    // The timeline went where the Config said, written when the group ended.
    EXPECT_TRUE(std::filesystem::exists(config.trace_prefix + ".rank" + std::to_string(r) + ".json")) << "rank " << r;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, ExplicitConfig, ::testing::Values("tcp", "shm"));

}  // namespace
}  // namespace lockstep
