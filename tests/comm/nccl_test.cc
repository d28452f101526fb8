// Asking for backend nccl where it cannot run (lockstep built without NCCL,
// or no CUDA device) is a ConfigError that names the cause, not a crash or
// a hang. Runs everywhere; skips on a machine where nccl does run.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "harness/bare_config.h"
#include "lockstep/config.h"
#include "lockstep/error.h"
#include "lockstep/process_group.h"
#include "lockstep/store.h"

namespace lockstep {
namespace {

TEST(NcclBackend, WithoutADeviceOrNcclFormingAGroupIsAConfigErrorNamingTheCause) {
  GroupOptions options;
  options.config = testing::bare_config();
  options.rank = 0;
  options.world_size = 1;
  options.backend = "nccl";
  options.store = std::make_shared<HashStore>();
  std::shared_ptr<ProcessGroup> pg;
  try {
    pg = init_process_group(options);
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("nccl"), std::string::npos) << message;
    const bool names_cause = message.find("needs a CUDA device") != std::string::npos ||
                             message.find("not built") != std::string::npos;
    EXPECT_TRUE(names_cause) << message;
    return;
  }
  ASSERT_NE(pg, nullptr);
  EXPECT_EQ(pg->backend(), "nccl");
  GTEST_SKIP() << "this machine has a CUDA device and lockstep has NCCL: the nccl backend formed a group";
}

TEST(NcclBackend, AutoNeverChoosesNccl) {
  GroupOptions options;
  options.config = testing::bare_config();
  options.rank = 0;
  options.world_size = 1;
  options.store = std::make_shared<HashStore>();
  auto pg = init_process_group(options);
  EXPECT_NE(pg->backend(), "nccl");
}

}  // namespace
}  // namespace lockstep
