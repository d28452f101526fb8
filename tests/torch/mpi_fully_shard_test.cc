// fully_shard over the mpi backend, under mpirun: every MPI rank trains its
// part of the global batch with the blocks and the root sharded, and every
// rank's whole parameters at the end equal one process training on the
// whole batch (which each rank also computes, on its own).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "lockstep/process_group.h"
#include "lockstep/torch/fully_shard.h"
#include "torch/fsdp_fixtures.h"

namespace lockstep::torch {
namespace {

using namespace fsdp_fixtures;

std::shared_ptr<ProcessGroup> mpi_world(const std::string& name) {
  GroupOptions options;
  options.backend = "mpi";
  options.name = name;
  return init_process_group(options);
}

class MpiFullyShard : public ::testing::TestWithParam<bool> {};

TEST_P(MpiFullyShard, TrainingEqualsOneProcessOnTheGlobalBatch) {
  const bool reshard = GetParam();
  auto pg = mpi_world(std::string("fully_shard_") + (reshard ? "reshard" : "keep"));
  ASSERT_EQ(pg->backend(), "mpi");
  const int rank = pg->rank(), ranks = pg->size();
  const auto data = batches(kWidths.front(), 23);
  const State want = train_reference("adam", data);
  FullyShardOptions options;
  options.reshard_after_forward = reshard;
  auto model = sharded_mlp(plain_mlp(), pg, options);
  auto opt = make_optimizer("adam", model->parameters());
  for (const auto& [x, y] : data) {
    opt->zero_grad();
    ::torch::mse_loss(model->forward(shard_of(x, rank, ranks)), shard_of(y, rank, ranks)).backward();
    opt->step();
  }
  expect_close(model->full_state_dict(rank), want, kRtol, "rank " + std::to_string(rank));
}

INSTANTIATE_TEST_SUITE_P(Resharding, MpiFullyShard, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "reshard" : "keep"; });

}  // namespace
}  // namespace lockstep::torch
