// broadcast_coalesced: large contiguous tensors travel in their own memory,
// the rest packed by dtype; either way every rank ends with the root's
// values, and autograd learns that each tensor changed, so a backward
// through a graph that saved one fails loudly instead of using new values.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <vector>

#include "lockstep/torch/ddp.h"
#include "torch/thread_ranks.h"

namespace lockstep::torch {
namespace {

using testing::TorchThreadWorld;

constexpr int kRanks = 3;
constexpr int kRoot = 1;
constexpr std::int64_t kLargeFloats = (2 << 20) / 4;  // 2 MiB: sent in place

// Rank r's tensors: a large float (in place), small floats and a small
// int64 (packed), and a large non-contiguous view (packed: no own memory).
std::vector<::torch::Tensor> tensors_of(int rank) {
  const double base = 1000.0 * rank;
  return {::torch::arange(kLargeFloats, ::torch::kFloat) + base,
          ::torch::full({3, 4}, base + 1, ::torch::kFloat),
          ::torch::full({5}, static_cast<std::int64_t>(base) + 2, ::torch::kLong),
          (::torch::arange(2 * kLargeFloats, ::torch::kFloat) + base).reshape({2, kLargeFloats}).t()};
}

TEST(BroadcastCoalesced, EveryRankEndsWithTheRootsTensors) {
  auto mine = testing::per_rank(kRanks, tensors_of);
  const auto expected = tensors_of(kRoot);
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) { broadcast_coalesced(pg, mine[rank], kRoot); });
  for (int rank = 0; rank < kRanks; ++rank)
    for (std::size_t i = 0; i < expected.size(); ++i)
      EXPECT_TRUE(::torch::equal(mine[rank][i], expected[i])) << "rank " << rank << " tensor " << i;
}

TEST(BroadcastCoalesced, AutogradSeesEveryTensorChange) {
  // Each rank saves its tensors in a graph (x * t saves t), then receives
  // the root's: every backward must refuse the changed tensor, the large
  // one written in its own memory as well as the packed ones.
  auto mine = testing::per_rank(kRanks, tensors_of);
  std::vector<std::vector<::torch::Tensor>> products(kRanks);
  std::vector<::torch::Tensor> inputs;
  for (int rank = 0; rank < kRanks; ++rank) {
    inputs.push_back(::torch::ones({kLargeFloats}, ::torch::requires_grad()));
    products[rank].push_back((inputs[rank] * mine[rank][0]).sum());
    products[rank].push_back((inputs[rank].narrow(0, 0, 12).view({3, 4}) * mine[rank][1]).sum());
  }
  TorchThreadWorld world(kRanks, "shm");
  world.run([&](int rank, ProcessGroup& pg) { broadcast_coalesced(pg, mine[rank], kRoot); });
  for (int rank = 0; rank < kRanks; ++rank)
    for (auto& product : products[rank])
      EXPECT_THROW(product.backward({}, /*retain_graph=*/true), c10::Error) << "rank " << rank;
}

}  // namespace
}  // namespace lockstep::torch
