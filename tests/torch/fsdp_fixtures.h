// What fully_shard's tests share: a model of blocks whose sizes are no
// multiple of 2, 3 or 4, its sharded form (each block a unit, then the
// root), the global batches, the one-process reference and the comparison.
// Models and data are drawn from generators of their own: thread ranks share
// libtorch's default one.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/torch/fully_shard.h"
#include "torch/fsdp_unit.h"

namespace lockstep::torch::fsdp_fixtures {

namespace nn = ::torch::nn;
using ::torch::Tensor;
using State = std::map<std::string, Tensor>;

constexpr int kSteps = 4;
constexpr int kGlobalBatch = 12;  // divides among 2, 3, 4 and 6 ranks
constexpr double kRtol = 1e-5;    // DDP's equivalence tests' tolerance

inline std::shared_ptr<ProcessGroup> borrow(ProcessGroup& pg) { return {&pg, [](ProcessGroup*) {}}; }

struct BlockImpl : nn::Module {
  BlockImpl(std::int64_t in, std::int64_t out) : fc(register_module("fc", nn::Linear(in, out))) {}
  Tensor forward(Tensor x) { return ::torch::tanh(fc->forward(x)); }
  nn::Linear fc;
};
// TORCH_MODULE(Block), spelled out: the macro names torch::nn, which inside
// lockstep::torch means lockstep's namespace.
class Block : public ::torch::nn::ModuleHolder<BlockImpl> {
 public:
  using ::torch::nn::ModuleHolder<BlockImpl>::ModuleHolder;
  using Impl = BlockImpl;
};

// Widths chosen so that no unit's size is a multiple of 2, 3 or 4.
inline const std::vector<std::int64_t> kWidths = {7, 13, 9, 11};
constexpr std::int64_t kOutputs = 5;

// Parameters drawn from a generator of the test's own (thread ranks share
// libtorch's default one), the same for every rank and the reference.
inline void init_from(nn::Module& net, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  ::torch::NoGradGuard no_grad;
  for (auto& p : net.parameters()) p.copy_(::torch::rand(p.sizes(), gen) - 0.5);
}

inline nn::Sequential plain_mlp() {
  nn::Sequential net;
  for (std::size_t i = 0; i + 1 < kWidths.size(); ++i) net->push_back(Block(kWidths[i], kWidths[i + 1]));
  net->push_back(nn::Linear(kWidths.back(), kOutputs));
  init_from(*net, 5);
  return net;
}

// The same model with each block a unit and the whole a root unit.
inline std::shared_ptr<FullyShard<nn::SequentialImpl>> sharded_mlp(nn::Sequential plain,
                                                            std::shared_ptr<ProcessGroup> pg,
                                                            FullyShardOptions options) {
  nn::Sequential net;
  for (std::size_t i = 0; i + 1 < plain->size(); ++i)
    net->push_back(fully_shard(plain->ptr<BlockImpl>(i), pg, options));
  net->push_back(*(plain->begin() + static_cast<std::ptrdiff_t>(plain->size() - 1)));
  return fully_shard(net, pg, options);
}

struct Batch {
  Tensor x, y;
};
inline std::vector<Batch> batches(std::int64_t inputs, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<Batch> out;
  for (int s = 0; s < kSteps; ++s)
    out.push_back({::torch::randn({kGlobalBatch, inputs}, gen), ::torch::randn({kGlobalBatch, kOutputs}, gen)});
  return out;
}
inline Tensor shard_of(const Tensor& global, int rank, int ranks) { return global.chunk(ranks)[rank]; }

inline std::unique_ptr<::torch::optim::Optimizer> make_optimizer(const std::string& kind, std::vector<Tensor> params) {
  if (kind == "adam") return std::make_unique<::torch::optim::Adam>(params, ::torch::optim::AdamOptions(0.02));
  return std::make_unique<::torch::optim::SGD>(params, ::torch::optim::SGDOptions(0.1).momentum(0.9));
}

inline State named(const nn::Module& net) {
  State out;
  for (const auto& item : net.named_parameters()) out[item.key()] = item.value().detach().clone();
  for (const auto& item : net.named_buffers()) out[item.key()] = item.value().detach().clone();
  return out;
}

inline void expect_close(const State& got, const State& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no " << name;
    const auto g = got.at(name).to(::torch::kDouble), wd = w.to(::torch::kDouble);
    ASSERT_EQ(g.sizes(), wd.sizes()) << what << ": " << name;
    EXPECT_TRUE(::torch::allclose(g, wd, rtol, rtol * 0.1))
        << what << ": " << name << " differs by " << (g - wd).abs().max().item<double>() << " (scale "
        << wd.abs().max().item<double>() << ")";
  }
}

// One process, the global batch.
inline State train_reference(const std::string& optimizer, const std::vector<Batch>& data) {
  auto net = plain_mlp();
  auto opt = make_optimizer(optimizer, net->parameters());
  for (const auto& [x, y] : data) {
    opt->zero_grad();
    ::torch::mse_loss(net->forward(x), y).backward();
    opt->step();
  }
  return named(*net);
}

// Every unit's shard, cloned, in the model's unit order.
inline std::vector<Tensor> unit_shards(FullyShardModule& model) {
  std::vector<Tensor> out;
  for (auto* unit : model.unit().step().units) out.push_back(unit->shard().clone());
  return out;
}

// Forward and backward of step `step`'s batch once per shard in `shards`
// (of `ranks` parts): a rank's own, or every shard a survivor holds.
template <typename Model>
void backward_on_shards(Model& model, const std::vector<Batch>& data, int step, const std::vector<int>& shards,
                        int ranks) {
  const Batch& batch = data[static_cast<std::size_t>(step)];
  for (int shard : shards)
    ::torch::mse_loss(model.forward(shard_of(batch.x, shard, ranks)), shard_of(batch.y, shard, ranks)).backward();
}

}  // namespace lockstep::torch::fsdp_fixtures
