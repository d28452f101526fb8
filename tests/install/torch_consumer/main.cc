// Uses only the installed headers of the torch component, as a new user
// would: a Sequential with BatchNorm converted to SyncBatchNorm, wrapped in
// DistributedDataParallel (class template argument deduction), trained a few
// steps with ZeroRedundancyOptimizer; then the replicas must be equal.
// Runs under `lockstep run` or as a world of one.
#include <lockstep/process_group.h>
#include <lockstep/torch/ddp.h>
#include <lockstep/torch/sync_batchnorm.h>
#include <lockstep/torch/zero.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  auto pg = lockstep::init_process_group();
  torch::manual_seed(pg->rank());  // different replicas: DDP makes them equal
  namespace nn = torch::nn;
  auto net = lockstep::torch::convert_sync_batchnorm(
      nn::Sequential(nn::Linear(4, 8), nn::BatchNorm1d(8), nn::ReLU(), nn::Linear(8, 2)), pg);
  lockstep::torch::DistributedDataParallel ddp(net, pg);
  lockstep::torch::ZeroRedundancyOptimizer opt(net->parameters(), pg, torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    torch::mse_loss(ddp.forward(torch::randn({6, 4})), torch::randn({6, 2})).backward();
    opt.step();
  }
  // Every rank's parameters equal rank 0's.
  auto flat = torch::cat({net->parameters()[0].flatten(), net->parameters().back().flatten()}).detach().contiguous();
  auto mine = flat.clone();
  pg->broadcast(lockstep::Buffer{flat.data_ptr(), static_cast<std::size_t>(flat.numel()), lockstep::DType::f32}, 0)
      ->wait();
  const bool same = flat.equal(mine);
  std::printf("torch consumer rank %d of %d: replicas %s\n", pg->rank(), pg->size(), same ? "equal" : "DIFFER");
  return same ? 0 : 1;
}
