// Fully sharded training (fully_shard, docs/fsdp.md): an MLP of --blocks
// wide blocks trained on Fashion-MNIST, each rank holding 1/N of its
// parameters, gradients and Adam state. The blocks are made and sharded one
// at a time, so no rank ever holds the whole model, before or during
// training:
//   build/lockstep run --nproc-per-node 4 -- build/examples/fully_sharded --blocks 8 --width 1024
//
// Rank 0 reports the loss and test accuracy, and every rank what it holds:
// its shards, their gradients and optimizer state, against what the whole
// model's would take. --checkpoint writes a sharded checkpoint at the end
// (one file per rank) and resumes from it when it exists.
#include <lockstep/error.h>
#include <lockstep/process_group.h>
#include <lockstep/torch/data.h>
#include <lockstep/torch/fully_shard.h>
#include <lockstep/torch/zero.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "fashion_mnist/dataset.h"

namespace {

namespace nn = torch::nn;
using lockstep::torch::fully_shard;

struct Options {
  int blocks = 8;
  std::int64_t width = 512;
  int steps = 200;
  int batch_size = 32;  // per rank
  double lr = 1e-3;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::size_t subset = 0;
  std::string checkpoint;
  bool reshard_after_forward = true;
};

struct BlockImpl : nn::Module {
  explicit BlockImpl(std::int64_t width)
      : fc(register_module("fc", nn::Linear(width, width))), norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({width})))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(fc->forward(norm->forward(x))); }
  nn::Linear fc;
  nn::LayerNorm norm;
};
TORCH_MODULE(Block);

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

std::int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0; }

// Parameters, gradients and optimizer state this rank holds.
std::int64_t held_bytes(nn::Module& model, const torch::optim::Optimizer& optimizer) {
  std::int64_t bytes = static_cast<std::int64_t>(lockstep::torch::optimizer_state_bytes(optimizer));
  for (const auto& p : model.parameters()) bytes += bytes_of(p) + bytes_of(p.grad());
  return bytes;
}

int run(const Options& o) {
  auto pg = lockstep::init_process_group();
  const int rank = pg->rank(), ranks = pg->size();
  lockstep::torch::FullyShardOptions sharding;
  sharding.reshard_after_forward = o.reshard_after_forward;

  // Each block is drawn and sharded before the next is made.
  torch::manual_seed(1);
  nn::Sequential net(nn::Flatten(), nn::Linear(28 * 28, o.width));
  std::int64_t model_elements = 28 * 28 * o.width + o.width;
  for (int b = 0; b < o.blocks; ++b) {
    Block block(o.width);
    for (const auto& p : block->parameters()) model_elements += p.numel();
    net->push_back(fully_shard(block, pg, sharding));
  }
  net->push_back(nn::Linear(o.width, 10));
  model_elements += o.width * 10 + 10;
  auto model = fully_shard(net, pg, sharding);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(o.lr));
  if (!o.checkpoint.empty() && lockstep::torch::load_sharded_checkpoint(*model, o.checkpoint, &optimizer) && rank == 0)
    std::printf("resumed from %s.rank<r>-of-%d\n", o.checkpoint.c_str(), ranks);

  fashion_mnist::Dataset train(o.data, true, o.subset), test(o.data, false, o.subset ? o.subset / 6 : 0);
  lockstep::torch::DistributedSampler sampler({.dataset_size = *train.size(), .num_replicas = ranks, .rank = rank});
  auto loader = torch::data::make_data_loader(train.map(torch::data::transforms::Stack<>()), sampler,
                                              torch::data::DataLoaderOptions(static_cast<std::size_t>(o.batch_size)));
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  int step = 0, epoch = 0;
  while (step < o.steps) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch++));
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
      if (++step % 50 == 0 && rank == 0) {
        std::printf("step %d: loss %.4f\n", step, loss_sum / 50);
        loss_sum = 0;
      }
      if (step == o.steps) break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Test accuracy over every test image once: each rank its share.
  lockstep::torch::DistributedSampler test_sampler(
      {.dataset_size = *test.size(), .num_replicas = ranks, .rank = rank, .shuffle = false, .exact = true});
  auto test_loader = torch::data::make_data_loader(test.map(torch::data::transforms::Stack<>()), test_sampler, 500);
  double counts[2] = {0, 0};  // correct, seen
  {
    torch::NoGradGuard no_grad;
    for (auto& batch : *test_loader) {
      counts[0] += model->forward(batch.data).argmax(1).eq(batch.target).sum().item<double>();
      counts[1] += static_cast<double>(batch.data.size(0));
    }
  }
  pg->allreduce(lockstep::Buffer{counts, 2, lockstep::DType::f64})->wait();

  const std::int64_t held = held_bytes(*model, optimizer);
  // The whole model's parameters, gradients and Adam's two moments, in fp32.
  const std::int64_t whole = model_elements * 4 * 4;
  std::vector<double> all_held(static_cast<std::size_t>(ranks), 0.0);
  all_held[static_cast<std::size_t>(rank)] = mib(held);
  pg->allreduce(lockstep::Buffer{all_held.data(), all_held.size(), lockstep::DType::f64})->wait();
  if (rank == 0) {
    std::printf("%d steps in %.1f s; test accuracy %.2f%% (%.0f images)\n", step, seconds, 100 * counts[0] / counts[1],
                counts[1]);
    std::printf("model: %lld parameters; parameters, gradients and Adam state in full: %.1f MiB\n",
                static_cast<long long>(model_elements), mib(whole));
    for (int r = 0; r < ranks; ++r)
      std::printf("rank %d holds %.1f MiB (%.2f of the whole)\n", r, all_held[static_cast<std::size_t>(r)],
                  all_held[static_cast<std::size_t>(r)] / mib(whole));
  }
  if (!o.checkpoint.empty()) lockstep::torch::save_sharded_checkpoint(*model, o.checkpoint, &optimizer);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Fully sharded training of a wide MLP on Fashion-MNIST"};
  app.add_option("--blocks", o.blocks, "residual blocks, each a sharding unit")->check(CLI::Range(1, 1000));
  app.add_option("--width", o.width, "width of every block")->check(CLI::Range(1, 65536));
  app.add_option("--steps", o.steps, "training steps")->check(CLI::Range(1, 10000000));
  app.add_option("--batch-size", o.batch_size, "samples per rank and step")->check(CLI::Range(1, 65536));
  app.add_option("--lr", o.lr, "Adam's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--data", o.data, "directory of the Fashion-MNIST IDX files");
  app.add_option("--subset", o.subset, "train on the first N samples only (0: all)");
  app.add_option("--checkpoint", o.checkpoint, "sharded checkpoint: resumed from when present, written at the end");
  app.add_flag("!--keep-after-forward", o.reshard_after_forward,
               "keep each block's gathered parameters from forward to backward (ZeRO-2)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fully_sharded: %s\n", e.what());
    return 1;
  }
}
