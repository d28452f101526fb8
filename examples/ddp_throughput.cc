// Step time of data-parallel training with lockstep's DistributedDataParallel
// (or, with --fsdp, fully sharded), the program behind the DDP and fully
// sharded numbers in docs/performance.md. Start it with
// the launcher, one process per core:
//   build/lockstep run --nproc-per-node 2 -- build/examples/ddp_throughput --model mlp
// Models: "mlp" (6 x Linear(2048, 2048) with ReLU, MSE loss; ~25M parameters),
// "wide-mlp" (6 x Linear(4096, 4096), MSE loss; ~101M parameters: the GPU
// workload, default batch 2048: a step of about 24 ms on an H200),
// "deep-mlp" (8 x Linear(1024, 1024), MSE loss; ~8.4M parameters: the fully
// sharded workload, default batch 32)
// and "convnet" (the Fashion-MNIST net: Conv 1->32->64, MaxPool, Linear
// 9216->128->10, cross-entropy). Batch is per rank (default 64, wide-mlp
// 2048, deep-mlp 32); SGD (--optimizer adam: Adam). --fsdp trains an MLP fully sharded
// (lockstep::torch::fully_shard: each Linear but the last a unit, then the
// root, which holds the last) instead of under DDP: bench/compare_fsdp.py
// measures it against PyTorch's FSDP2 and this program's DDP. --no-sync measures
// the same step with gradient synchronisation off, so step - no_sync step is
// the communication the step exposes. --device cuda trains on the GPU of
// the local rank (cuda:(local rank % devices), the local rank as any
// launcher sets it), timing each step until the device is done with it;
// --no-ddp trains the same model without the DDP wrapper, the baseline of
// DDP's overhead in a world of one. A loss that becomes NaN or infinite
// stops the run (exit 1).
//
// One process is one run: it prints the median step of its timed steps. To
// compare configurations, run each several times in turn, interleaved
// (bench/compare_ddp.py, bench/compare_gpu_ddp.py): repetitions inside one
// process would share its placement, allocator and clocks, so their spread
// would understate the run-to-run one, and a drift of the machine over a
// minute would land on one configuration instead of all.
#include <lockstep/error.h>
#include <lockstep/error_file.h>
#include <lockstep/affinity.h>
#include <lockstep/powersgd.h>
#include <lockstep/process_group.h>
#include <lockstep/torch/ddp.h>
#include <lockstep/torch/fully_shard.h>
#include <lockstep/torch/resilient_fsdp.h>
#include <lockstep/torch/shard_backup.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <lockstep_models/models.h>
#include <lockstep_option_checks/option_checks.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

using examples::ConvNetImpl;
using examples::DeepMlpImpl;
using examples::MlpImpl;
using examples::WideMlpImpl;

struct Options {
  std::string model = "mlp";
  int batch = 0;  // 0: the model's default (default_batch)
  int steps = 20;
  int warmup = 3;
  bool no_sync = false;
  bool no_ddp = false;
  bool fsdp = false;
  bool reshard_after_forward = true;  // --keep-after-forward: false (ZeRO-2)
  bool shard_backup = false;          // --shard-backup: each rank keeps its predecessor's shards
  bool resilient = false;             // --resilient: the steps by ShardedResilientTrainer
  std::string optimizer = "sgd";
  std::string device = "cpu";
  bool bucket_view = false;
  double bucket_cap_mb = 25;
  bool autotune = false;
  std::string hook = "none";
  int powersgd_rank = 1;
};

// Samples per rank when --batch is not given: wide-mlp is the GPU workload,
// whose step should take tens of milliseconds there (2048 x 6 x 101M
// parameters: 1.2 Tflop per step).
int default_batch(const std::string& model) {
  if (model == "wide-mlp") return 2048;
  return model == "deep-mlp" ? 32 : 64;
}

// The device this rank trains on: the CPU, or its local rank's GPU.
torch::Device training_device(const std::string& name, int local_rank) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available())
    throw lockstep::ConfigError("--device cuda: libtorch sees no CUDA device (or was built without CUDA)");
  const int index = local_rank % static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

// This rank's median step, and the communication DDP left exposed in it
// (its own count; 0 without DDP).
struct StepTimes {
  double step_ms = 0;
  double exposed_ms = 0;
};

// Runs o.warmup untimed steps, then o.steps timed ones: train_step takes
// one (gradients zeroed, forward, backward, the optimizer's step) and
// returns its loss. exposed_ms() is read after each timed step.
StepTimes time_steps(const Options& o, torch::Device device, int rank, const std::function<torch::Tensor()>& train_step,
                     const std::function<double()>& exposed_ms) {
  // A step ends when the device is done with it, not when it is queued.
  const auto finish_step = [&] {
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
  };
  std::vector<double> step_ms, exposed;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor loss = train_step();
    finish_step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // Read after the step is timed, so the read (a copy from the GPU with
    // --device cuda, after finish_step has waited for it) is not measured.
    // Steps on diverged parameters would time a different computation.
    if (const double l = loss.item<double>(); !std::isfinite(l))
      throw std::runtime_error("the loss became " + std::string(std::isnan(l) ? "nan" : "inf") + " at step " +
                               std::to_string(s + 1) + " on rank " + std::to_string(rank) +
                               "; the timings of such steps mean nothing");
    if (s >= o.warmup) {
      step_ms.push_back(ms);
      exposed.push_back(exposed_ms());
    }
  }
  std::sort(step_ms.begin(), step_ms.end());
  std::sort(exposed.begin(), exposed.end());
  return {step_ms[step_ms.size() / 2], exposed[exposed.size() / 2]};
}

// How the model was trained, as the report says it.
std::string training_mode(const Options& o) {
  if (o.fsdp)
    return std::string("fully sharded") + (o.shard_backup ? ", backup shards" : "") +
           (o.resilient ? ", ShardedResilientTrainer" : "");
  return std::string(o.no_ddp ? "without DDP" : o.no_sync ? "no_sync" : "synchronised") +
         (o.bucket_view ? ", gradient_as_bucket_view" : "");
}

// Rank 0 prints the slowest rank's medians, as the step is only as fast as
// it. Collective.
void report(const Options& o, lockstep::ProcessGroup& pg, torch::Device device, std::size_t params, StepTimes t) {
  pg.allreduce(lockstep::Buffer{&t.step_ms, 1, lockstep::DType::f64}, lockstep::ReduceOp::max)->wait();
  pg.allreduce(lockstep::Buffer{&t.exposed_ms, 1, lockstep::DType::f64}, lockstep::ReduceOp::max)->wait();
  if (pg.rank() != 0) return;
  std::printf("model %s (%.1fM parameters) on %s, %d rank(s), backend %s, batch %d per rank, %s, hook %s\n",
              o.model.c_str(), static_cast<double>(params) / 1e6, device.str().c_str(), pg.size(), pg.backend().c_str(),
              o.batch, training_mode(o).c_str(), o.hook.c_str());
  if (o.fsdp)  // DDP's exposed communication has no counterpart here
    std::printf("step_ms %.2f samples_per_s %.1f\n", t.step_ms, o.batch * pg.size() * 1000.0 / t.step_ms);
  else
    std::printf("step_ms %.2f exposed_comm_ms %.2f samples_per_s %.1f\n", t.step_ms, t.exposed_ms,
                o.batch * pg.size() * 1000.0 / t.step_ms);
}

std::size_t parameter_count(torch::nn::Module& model) {
  std::size_t params = 0;
  for (auto& p : model.parameters()) params += static_cast<std::size_t>(p.numel());
  return params;
}

// This rank's inputs and targets, the same every step.
struct Batch {
  torch::Tensor x, y;
};
Batch rank_batch(const Options& o, int rank, torch::Device device) {
  const bool conv = o.model == "convnet";
  const int64_t width = o.model == "wide-mlp"   ? WideMlpImpl::kWidth
                        : o.model == "deep-mlp" ? DeepMlpImpl::kWidth
                                                : 2048;
  torch::manual_seed(100 + rank);
  auto x = (conv ? torch::randn({o.batch, 1, 28, 28}) : torch::randn({o.batch, width})).to(device);
  auto y = (conv ? torch::randint(0, 10, {o.batch}) : torch::randn({o.batch, width})).to(device);
  return {x, y};
}

torch::Tensor loss_of(const Options& o, const torch::Tensor& out, const torch::Tensor& y) {
  return o.model == "convnet" ? torch::cross_entropy_loss(out, y) : torch::mse_loss(out, y);
}

std::unique_ptr<torch::optim::Optimizer> optimizer_of(const Options& o, std::vector<torch::Tensor> params) {
  if (o.optimizer == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-4));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.01));
}

// FSDP2's recipe for a model of blocks (each block a unit, then the whole
// model), as bench/pytorch_ddp.py --fsdp applies it: each Linear but the
// last a unit of its own, then the root, which holds the last.
std::shared_ptr<lockstep::torch::FullyShard<torch::nn::SequentialImpl>> fully_sharded(
    MlpImpl& mlp, const std::shared_ptr<lockstep::ProcessGroup>& pg, bool reshard_after_forward) {
  lockstep::torch::FullyShardOptions options;
  options.reshard_after_forward = reshard_after_forward;
  torch::nn::Sequential net;
  for (std::size_t i = 0; i + 1 < mlp.fc.size(); ++i) {
    net->push_back(lockstep::torch::fully_shard(mlp.fc[i], pg, options));
    net->push_back(torch::nn::ReLU());
  }
  net->push_back(mlp.fc.back());
  return lockstep::torch::fully_shard(net, pg, options);
}

int run_fully_sharded(const Options& o, const std::shared_ptr<lockstep::ProcessGroup>& pg, MlpImpl& mlp,
                      torch::Device device) {
  const std::size_t params = parameter_count(mlp);  // whole: sharding leaves this rank's pieces
  auto model = fully_sharded(mlp, pg, o.reshard_after_forward);
  const auto opt = optimizer_of(o, model->parameters());
  std::unique_ptr<lockstep::torch::ShardBackup> backup;
  if (o.shard_backup) backup = std::make_unique<lockstep::torch::ShardBackup>(*model, *opt);
  const Batch batch = rank_batch(o, pg->rank(), device);
  std::unique_ptr<lockstep::torch::ShardedResilientTrainer> trainer;
  if (o.resilient) trainer = std::make_unique<lockstep::torch::ShardedResilientTrainer>(model, *opt, *backup);
  const StepTimes t = time_steps(
      o, device, pg->rank(),
      [&] {
        if (trainer) {
          // Every rank computes its own shard: the same batch as below.
          const auto outcome = trainer->step([&](const lockstep::torch::Shard&) {
            return loss_of(o, model->forward(batch.x), batch.y);
          });
          return torch::tensor(outcome.losses.front());
        }
        opt->zero_grad();
        auto loss = loss_of(o, model->forward(batch.x), batch.y);
        loss.backward();
        if (backup) backup->send_gradients();  // overlaps the optimizer's step
        opt->step();
        if (backup) backup->step();
        return loss;
      },
      [] { return 0.0; });
  report(o, *pg, device, params, t);
  if (backup) {
    backup->verify();  // what was timed kept the copies exact
    if (pg->rank() == 0) std::printf("shard_backup_bytes %zu\n", backup->bytes());
  }
  return 0;
}

template <typename Model>
int run(const Options& o, std::shared_ptr<lockstep::ProcessGroup> pg) {
  const torch::Device device = training_device(o.device, pg->config().launcher.local_rank);
  torch::manual_seed(1);
  auto model = std::make_shared<Model>();
  model->to(device);
  if constexpr (std::is_base_of_v<MlpImpl, Model>) {
    if (o.fsdp) return run_fully_sharded(o, pg, *model, device);
  }
  lockstep::torch::DDPOptions ddp_options;
  ddp_options.gradient_as_bucket_view = o.bucket_view;
  ddp_options.bucket_cap_mb = o.bucket_cap_mb;
  ddp_options.autotune_bucket_cap = o.autotune;
  if (o.hook == "fp16") ddp_options.comm_hook = lockstep::fp16_compress_hook();
  if (o.hook == "bf16") ddp_options.comm_hook = lockstep::bf16_compress_hook();
  std::shared_ptr<lockstep::PowerSGDHook> powersgd;
  if (o.hook == "powersgd" || o.hook == "batched_powersgd") {
    lockstep::PowerSGDOptions psgd;
    psgd.matrix_approximation_rank = o.powersgd_rank;
    psgd.start_powersgd_iter = 2;  // compressed from the third step, inside the warm-up
    powersgd = o.hook == "powersgd" ? lockstep::powersgd_hook(psgd) : lockstep::batched_powersgd_hook(psgd);
    ddp_options.comm_hook = powersgd;
  }
  std::unique_ptr<lockstep::torch::DistributedDataParallel<Model>> ddp;
  if (!o.no_ddp) ddp = std::make_unique<lockstep::torch::DistributedDataParallel<Model>>(model, pg, ddp_options);
  const auto opt = optimizer_of(o, model->parameters());
  const Batch batch = rank_batch(o, pg->rank(), device);
  const auto forward_backward = [&] {
    auto loss = loss_of(o, ddp ? ddp->forward(batch.x) : model->forward(batch.x), batch.y);
    loss.backward();
    return loss;
  };
  const StepTimes t = time_steps(
      o, device, pg->rank(),
      [&] {
        opt->zero_grad();
        torch::Tensor loss;
        if (o.no_sync && ddp) {
          auto guard = ddp->no_sync();  // as in PyTorch, around the forward and the backward
          loss = forward_backward();
        } else {
          loss = forward_backward();
        }
        opt->step();
        return loss;
      },
      [&] { return ddp ? ddp->last_step().backward.exposed_communication_ms() : 0.0; });
  report(o, *pg, device, parameter_count(*model), t);
  if (pg->rank() == 0) {
    if (powersgd) std::printf("compression_ratio %.1f\n", powersgd->compression_stats().ratio());
    if (ddp && ddp->bucket_autotune())
      std::printf("autotuned bucket_cap_mb %.2f buckets %zu (predicted exposed %.2f ms, %.2f ms at %.0f MB)\n",
                  ddp->bucket_cap_mb(), ddp->bucket_autotune()->buckets, ddp->bucket_autotune()->predicted_exposed_ms, ddp->bucket_autotune()->configured_exposed_ms,
                  o.bucket_cap_mb);
  }
  return 0;
}

int main(int argc, char** argv) {
  namespace checks = lockstep::option_checks;
  CLI::App app{"Step time of lockstep DistributedDataParallel (or fully sharded) training"};
  Options o;
  app.add_option("--model", o.model, "mlp, wide-mlp (the GPU workload), deep-mlp (the fully sharded one) or convnet")
      ->check(CLI::IsMember({"mlp", "wide-mlp", "deep-mlp", "convnet"}));
  app.add_option("--batch", o.batch, "Samples per rank per step (default 64; wide-mlp 2048, deep-mlp 32)")
      ->check(checks::positive_count());
  app.add_option("--steps", o.steps, "Timed steps (the median is reported)")->check(checks::positive_count());
  app.add_option("--warmup", o.warmup, "Untimed steps first")->check(checks::non_negative_count());
  auto* no_sync = app.add_flag("--no-sync", o.no_sync, "Backward under no_sync (no gradient communication)");
  auto* bucket_view = app.add_flag("--bucket-view", o.bucket_view, "gradient_as_bucket_view");
  auto* no_ddp = app.add_flag("--no-ddp", o.no_ddp, "Train without the DDP wrapper (the baseline of its overhead)");
  app.add_option("--device", o.device, "cpu, or cuda (the local rank's GPU)")->check(CLI::IsMember({"cpu", "cuda"}));
  auto* bucket_cap = app.add_option("--bucket-cap-mb", o.bucket_cap_mb,
                                    "Bucket size cap (with --autotune: of the measured first steps)")
                         ->check(checks::positive_number(1 << 20));
  auto* autotune = app.add_flag("--autotune", o.autotune, "Choose the bucket cap from the first steps' measurements");
  auto* hook = app.add_option("--hook", o.hook, "none, fp16, bf16, powersgd or batched_powersgd")
                   ->check(CLI::IsMember({"none", "fp16", "bf16", "powersgd", "batched_powersgd"}));
  app.add_option("--powersgd-rank", o.powersgd_rank, "Approximation rank of the PowerSGD hooks")
      ->check(checks::positive_count());
  app.add_flag("--fsdp", o.fsdp, "Train an MLP fully sharded (fully_shard, each Linear a unit) instead of under DDP")
      ->excludes(no_sync)
      ->excludes(bucket_view)
      ->excludes(no_ddp)
      ->excludes(bucket_cap)
      ->excludes(autotune)
      ->excludes(hook);
  app.add_flag("!--keep-after-forward", o.reshard_after_forward,
               "With --fsdp: keep each unit's gathered parameters from its forward to its backward (ZeRO-2)")
      ->needs("--fsdp");
  app.add_flag("--shard-backup", o.shard_backup,
               "With --fsdp: each rank keeps a copy of its ring predecessor's shards and their optimizer state, "
               "stepped with the gradients it sends (lockstep::torch::ShardBackup)")
      ->needs("--fsdp");
  app.add_flag("--resilient", o.resilient,
               "With --shard-backup: the steps taken by lockstep::torch::ShardedResilientTrainer, which survives a "
               "rank's death in place (its commit point and the backup's exchange before it)")
      ->needs("--shard-backup");
  app.add_option("--optimizer", o.optimizer, "sgd (lr 0.01) or adam (lr 1e-4)")->check(CLI::IsMember({"sgd", "adam"}));
  CLI11_PARSE(app, argc, argv);
  if (o.fsdp && o.model == "convnet") {
    std::fprintf(stderr, "ddp_throughput: --fsdp shards the MLPs (mlp, wide-mlp, deep-mlp), not the convnet\n");
    return 2;
  }
  if (o.batch == 0) o.batch = default_batch(o.model);
  try {
    // One core per rank where LOCAL_RANK is set (torchrun, `lockstep
    // run`), as bench/pytorch_ddp.py does for PyTorch's ranks; before
    // libtorch starts its threads, which inherit the pinning. Read once,
    // checked, through Config.
    const lockstep::Config config = lockstep::Config::from_environment();
    if (config.local_rank) lockstep::pin_to_core_of_local_rank(*config.local_rank);
    at::set_num_threads(1);  // one core per rank
    lockstep::GroupOptions group;
    group.config = config;
    auto pg = lockstep::init_process_group(group);
    if (o.model == "mlp") return run<MlpImpl>(o, pg);
    if (o.model == "wide-mlp") return run<WideMlpImpl>(o, pg);
    if (o.model == "deep-mlp") return run<DeepMlpImpl>(o, pg);
    return run<ConvNetImpl>(o, pg);
  } catch (const lockstep::Error& e) {
    // The message says what went wrong and what to do; no abort() and core.
    lockstep::record_error(e);  // TORCHELASTIC_ERROR_FILE, for the launcher's report
    std::fprintf(stderr, "ddp_throughput: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    lockstep::record_error(e);  // TORCHELASTIC_ERROR_FILE, for the launcher's report
    std::fprintf(stderr, "ddp_throughput: %s\n", e.what());
    return 1;
  }
}
