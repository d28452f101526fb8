// broadcast_coalesced: large contiguous tensors travel in their own memory,
// the rest packed by dtype; either way every rank ends with the root's
// values, and autograd learns that each tensor changed, so a backward
// through a graph that saved one fails loudly instead of using new values.
// send_coalesced: the same to some ranks alone; the others keep theirs.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
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

// Over shm and tcp (sends and receives in place of a broadcast), to one
// rank and to two: the receivers end with the root's tensors, the root and
// the rest keep their own, untouched.
TEST(SendCoalesced, OnlyTheReceiversEndWithTheRootsTensors) {
  for (const char* backend : {"shm", "tcp"})
    for (const std::vector<int>& receivers : {std::vector<int>{2}, std::vector<int>{0, 2}}) {
      auto mine = testing::per_rank(kRanks, tensors_of);
      TorchThreadWorld world(kRanks, backend);
      world.run([&](int rank, ProcessGroup& pg) { send_coalesced(pg, mine[rank], kRoot, receivers); });
      for (int rank = 0; rank < kRanks; ++rank) {
        const bool receives = std::find(receivers.begin(), receivers.end(), rank) != receivers.end();
        const auto expected = tensors_of(receives ? kRoot : rank);
        for (std::size_t i = 0; i < expected.size(); ++i)
          EXPECT_TRUE(::torch::equal(mine[rank][i], expected[i]))
              << backend << ", " << receivers.size() << " receiver(s): rank " << rank << " tensor " << i;
      }
    }
}

TEST(SendCoalesced, TheRootAsAReceiverIsRefused) {
  auto mine = testing::per_rank(kRanks, tensors_of);
  TorchThreadWorld world(kRanks, "shm");
  const std::vector<int> receivers = {kRoot};
  const auto errors =
      world.run_collecting([&](int rank, ProcessGroup& pg) { send_coalesced(pg, mine[rank], kRoot, receivers); });
  for (int rank = 0; rank < kRanks; ++rank) EXPECT_TRUE(errors[static_cast<std::size_t>(rank)] != nullptr) << rank;
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
