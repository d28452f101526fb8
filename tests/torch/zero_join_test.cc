// ZeroRedundancyOptimizer under Join with DDP: rank processes with uneven
// batch counts all finish (each within a deadline, far below the collective
// timeout: without the optimizer in the Join they waited there), and every
// rank ends with the parameters PyTorch defines for uneven inputs: in step t
// the ranks that still have a batch contribute their gradients, the joined
// ones zeros, the sum is divided by the initial world size (or by the ranks
// still training), and the whole unsharded optimizer steps on it. The
// reference is that computation in one process, in double precision.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "harness/process_ranks.h"
#include "harness/reserved_port.h"
#include "lockstep/process_group.h"
#include "lockstep/torch/ddp.h"
#include "lockstep/torch/join.h"
#include "lockstep/torch/zero.h"

namespace lockstep::torch {
namespace {

namespace nn = ::torch::nn;
using ::torch::Tensor;

constexpr int kBatch = 5;
// No collective may wait this long (seconds): a rank left waiting for a
// collective the others never issue fails with TimeoutError after it.
constexpr int kCollectiveTimeoutS = 20;

nn::Sequential make_mlp() {
  ::torch::manual_seed(11);
  nn::Sequential net(nn::Linear(6, 24), nn::Tanh(), nn::Linear(24, 16), nn::ReLU(), nn::Linear(16, 3));
  net->to(::torch::kDouble);
  return net;
}

using Batches = std::vector<std::vector<std::pair<Tensor, Tensor>>>;  // [rank][t]
Batches make_batches(const std::vector<int>& counts) {
  Batches out(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    ::torch::manual_seed(200 + static_cast<int>(r));
    for (int t = 0; t < counts[r]; ++t)
      out[r].emplace_back(::torch::randn({kBatch, 6}, ::torch::kDouble), ::torch::randn({kBatch, 3}, ::torch::kDouble));
  }
  return out;
}

struct Case {
  std::vector<int> batches;  // per rank
  std::string optimizer;     // "sgd" or "adam"
  bool zero_listed_first = false;
  JoinOptions join;
  ZeroOptions zero;  // the layout of the shards
};

std::unique_ptr<::torch::optim::Optimizer> unsharded(const std::string& name, std::vector<Tensor> params) {
  if (name == "sgd")
    return std::make_unique<::torch::optim::SGD>(std::move(params), ::torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<::torch::optim::Adam>(std::move(params), ::torch::optim::AdamOptions(0.01));
}

ZeroRedundancyOptimizer::OptimizerFactory factory(const std::string& name) {
  return [name](std::vector<Tensor> params) { return unsharded(name, std::move(params)); };
}

std::vector<Tensor> values(nn::Module& net) {
  std::vector<Tensor> out;
  for (const auto& p : net.parameters()) out.push_back(p.detach().clone());
  return out;
}

// One process: step t sums the gradients of the ranks that have a t-th
// batch, divided as the Join divides, and the unsharded optimizer steps.
std::vector<Tensor> reference(const Case& c, const Batches& batches) {
  auto net = make_mlp();
  auto opt = unsharded(c.optimizer, net->parameters());
  const int world = static_cast<int>(c.batches.size());
  const int steps = *std::max_element(c.batches.begin(), c.batches.end());
  for (int t = 0; t < steps; ++t) {
    int active = 0;
    for (int n : c.batches) active += n > t ? 1 : 0;
    const double divisor = c.join.divide_by_initial_world_size ? world : active;
    opt->zero_grad();
    for (int r = 0; r < world; ++r) {
      if (c.batches[static_cast<std::size_t>(r)] <= t) continue;
      const auto& [x, y] = batches[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
      (::torch::mse_loss(net->forward(x), y) / divisor).backward();
    }
    opt->step();
  }
  return values(*net);
}

struct TempDir {
  TempDir() {
    char name[] = "/tmp/lockstep-zero-join-XXXXXX";
    path = ::mkdtemp(name);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  std::string path;
};

// Several buckets, so the joined rank shadows each in order.
DDPOptions small_buckets() {
  DDPOptions o;
  o.first_bucket_mb = 0.001;
  o.bucket_cap_mb = 0.001;
  return o;
}

// Trains in one process per rank under Join({ddp, zero}); each rank saves
// its final parameters to <dir>/rank<r>.pt.
void train_in_processes(const Case& c, const Batches& batches, const std::string& dir) {
  const int world = static_cast<int>(c.batches.size());
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  testing::ProcessRanks ranks(
      world,
      [&](int rank) { return testing::rank_env(rank, world, port, "shm", kCollectiveTimeoutS); },
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = init_process_group();
        auto net = make_mlp();
        DistributedDataParallel ddp(net, pg, small_buckets());
        ZeroRedundancyOptimizer zero(net->parameters(), pg, factory(c.optimizer), c.zero);
        {
          std::optional<Join> join;
          if (c.zero_listed_first) join.emplace(std::vector<std::reference_wrapper<Joinable>>{zero, ddp}, c.join);
          else join.emplace(std::vector<std::reference_wrapper<Joinable>>{ddp, zero}, c.join);
          for (const auto& [x, y] : batches[static_cast<std::size_t>(rank)]) {
            zero.zero_grad();
            ::torch::mse_loss(ddp.forward(x), y).backward();
            zero.step();
          }
          join->join();
        }
        ::torch::save(values(*net), fmt::format("{}/rank{}.pt", dir, rank));
      });
  for (const auto& r : ranks.wait_all(std::chrono::seconds(3 * kCollectiveTimeoutS))) {
    EXPECT_EQ(r.exit_code, testing::kExitOk) << testing::describe(r);
    EXPECT_FALSE(r.hit_deadline) << testing::describe(r);
  }
}

void expect_reference(const Case& c) {
  const Batches batches = make_batches(c.batches);
  const TempDir dir;
  const auto start = Clock::now();
  train_in_processes(c, batches, dir.path);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // A rank that waited for a collective the others never issued would have
  // failed after the timeout; a finished run took far less.
  EXPECT_LT(seconds, kCollectiveTimeoutS) << "the ranks took " << seconds << " s";
  if (::testing::Test::HasFailure()) return;  // a rank failed: its output is above
  const auto expected = reference(c, batches);
  for (std::size_t r = 0; r < c.batches.size(); ++r) {
    std::vector<Tensor> got;
    ::torch::load(got, fmt::format("{}/rank{}.pt", dir.path, r));
    ASSERT_EQ(got.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const double diff = (got[i] - expected[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-9) << "rank " << r << ", parameter " << i << " differs by " << diff;
    }
  }
}

// Without the optimizer in the Join the ranks cannot finish: the joined
// rank's all-reduce meets the others' all-gather. They fail at once (a
// MismatchError, where the backend compares collectives; a TimeoutError
// after the collective timeout elsewhere), and the errors say to list the
// optimizer.
class LeftOut : public ::testing::TestWithParam<std::string> {};

TEST_P(LeftOut, OfTheJoinTheRanksFailSayingToListIt) {
  const Batches batches = make_batches({1, 3});
  const testing::ReservedPort reserved_port;
  const int port = reserved_port.number();
  testing::ProcessRanks ranks(
      2,
      [&](int rank) { return testing::rank_env(rank, 2, port, GetParam(), 3); },
      [&](int rank) {
        at::set_num_threads(1);
        auto pg = init_process_group();
        auto net = make_mlp();
        DistributedDataParallel ddp(net, pg);
        ZeroRedundancyOptimizer zero(net->parameters(), pg, factory("sgd"));
        Join join({ddp});
        for (const auto& [x, y] : batches[static_cast<std::size_t>(rank)]) {
          zero.zero_grad();
          ::torch::mse_loss(ddp.forward(x), y).backward();
          zero.step();
        }
        join.join();
      });
  std::string outputs;
  for (const auto& r : ranks.wait_all(std::chrono::seconds(60))) {
    EXPECT_NE(r.exit_code, testing::kExitOk) << testing::describe(r);
    EXPECT_FALSE(r.hit_deadline) << testing::describe(r);
    outputs += r.output;
  }
  EXPECT_NE(outputs.find("Join({ddp, zero})"), std::string::npos) << outputs;
}

INSTANTIATE_TEST_SUITE_P(ZeroJoin, LeftOut, ::testing::Values("shm", "tcp"));

class UnevenBatches : public ::testing::TestWithParam<std::tuple<std::vector<int>, std::string>> {};

TEST_P(UnevenBatches, EveryRankEndsWithTheReferenceParameters) {
  expect_reference({std::get<0>(GetParam()), std::get<1>(GetParam())});
}

INSTANTIATE_TEST_SUITE_P(ZeroJoin, UnevenBatches,
                         ::testing::Combine(::testing::Values(std::vector<int>{3, 6}, std::vector<int>{4, 2, 6}),
                                            ::testing::Values("sgd", "adam")),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param).size()) + "ranks_" + std::get<1>(info.param);
                         });

TEST(ZeroJoin, ARankWithNoBatchesStepsItsShardFromTheStart) { expect_reference({{0, 3, 5}, "adam"}); }

TEST(ZeroJoin, ListingTheOptimizerBeforeDdpShadowsAlike) { expect_reference({{5, 2}, "sgd", true}); }

// The joined rank's shadow steps move its pieces and fill the buckets as a
// training rank's do.
TEST(ZeroJoin, BucketViewsShadowAlike) {
  Case c{{3, 6}, "sgd"};
  c.zero.parameters_as_bucket_view = true;
  expect_reference(c);
}

TEST(ZeroJoin, BalancedElementsInBucketViewsShadowAlike) {
  Case c{{4, 2, 6}, "adam"};
  c.zero.parameters_as_bucket_view = true;
  c.zero.partition = ZeroPartition::balanced_elements;
  expect_reference(c);
}

TEST(ZeroJoin, DividedByTheRanksStillTraining) {
  JoinOptions join;
  join.divide_by_initial_world_size = false;
  expect_reference({{2, 5, 3}, "adam", false, join});
}

}  // namespace
}  // namespace lockstep::torch
