// ResilientTrainer refuses what a death in place cannot yet survive
// (docs/faults.md), naming the restart such a job falls back to: sharded
// optimizer state (ZeroRedundancyOptimizer), sharded parameters
// (fully_shard) and forwards that call collectives (SyncBatchNorm with a
// group). The kill matrix (in_place_recovery_test) covers what it does
// survive.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "lockstep/error.h"
#include "lockstep/torch/fully_shard.h"
#include "lockstep/torch/resilient.h"
#include "lockstep/torch/sync_batchnorm.h"
#include "lockstep/torch/zero.h"
#include "thread_ranks.h"
#include "zero_fixtures.h"

namespace lockstep::torch {
namespace {

namespace nn = ::torch::nn;
using testing::TorchThreadWorld;

// The message of the ConfigError that constructing the trainer throws.
std::string refusal(const std::function<void()>& construct) {
  try {
    construct();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

void expect_refused(const std::string& message, const std::string& cause) {
  EXPECT_NE(message.find(cause), std::string::npos) << message;
  EXPECT_NE(message.find("--on-rank-failure restart"), std::string::npos) << message;
}

TEST(ResilientTrainer, RefusesZeroRedundancyOptimizer) {
  TorchThreadWorld world(1);
  nn::Linear net(4, 2);
  world.run([&](int, ProcessGroup& pg) {
    ZeroRedundancyOptimizer zero(net->parameters(), zero_fixtures::borrow(pg), ::torch::optim::SGDOptions(0.1));
    expect_refused(refusal([&] { ResilientTrainer(net.ptr(), zero, zero_fixtures::borrow(pg)); }),
                   "ZeroRedundancyOptimizer keeps each rank's optimizer state");
  });
}

TEST(ResilientTrainer, RefusesSyncBatchNormWithAGroup) {
  TorchThreadWorld world(1);
  nn::Sequential net(nn::Linear(4, 3), SyncBatchNorm(SyncBatchNormOptions(3)));
  ::torch::optim::SGD sgd(net->parameters(), 0.1);
  world.run([&](int, ProcessGroup& pg) {
    net[1]->as<SyncBatchNormImpl>()->set_process_group(zero_fixtures::borrow(pg));
    expect_refused(refusal([&] { ResilientTrainer(net.ptr(), sgd, zero_fixtures::borrow(pg)); }),
                   "is a SyncBatchNorm, whose forward calls collectives");
  });
}

TEST(ResilientTrainer, RefusesAFullyShardedModel) {
  TorchThreadWorld world(1);
  nn::Linear net(4, 2);
  world.run([&](int, ProcessGroup& pg) {
    auto sharded = fully_shard(net, zero_fixtures::borrow(pg));
    ::torch::optim::SGD sgd(sharded->parameters(), 0.1);
    expect_refused(refusal([&] { ResilientTrainer(sharded, sgd, zero_fixtures::borrow(pg)); }), "is fully sharded");
  });
}

}  // namespace
}  // namespace lockstep::torch
