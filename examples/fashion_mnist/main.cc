// The main job (`make run`): a convnet trained on Fashion-MNIST with
// lockstep's DistributedDataParallel, one process per rank:
//   build/lockstep run --nproc-per-node 2 --unprefixed-rank0 -- build/examples/fashion_mnist
//
// Each epoch, rank 0 draws a progress bar, then reports the training loss,
// the test accuracy computed exactly across ranks (every test image counted
// once), the throughput, and how a step splits into compute, exposed
// communication and data loading. At each epoch end rank 0 writes a
// checkpoint atomically (with --checkpoint-every, also every N steps); a
// restarted job (lockstep run --max-restarts) or a new one with the same
// --checkpoint resumes from it, on any number of ranks: an elastic job that
// lost or gained nodes goes on from the last checkpoint with the rest of the
// epoch's samples dealt to the new world (DistributedSampler's resume_at).
// Each rank keeps --batch-size, so the global batch follows the world size;
// the learning rate stays as given (see docs/launcher.md).
// When stdout is not a terminal (a log), progress is a line every
// --progress-every seconds instead of a redrawn bar.
// --batchnorm adds batch normalisation after each conv, --sync-batchnorm
// makes it use the global batch's statistics (SyncBatchNorm), --zero shards
// the optimizer state across ranks (ZeroRedundancyOptimizer; checkpoints
// stay the same). Every numeric option is range-checked before anything
// runs, and a loss that becomes NaN or infinite stops the run (exit 1) with
// a sentence naming the step, the epoch and the rank.
#include <lockstep/error.h>
#include <lockstep/error_file.h>
#include <lockstep/process_group.h>
#include <lockstep/torch/data.h>
#include <lockstep/torch/ddp.h>
#include <lockstep/torch/sync_batchnorm.h>
#include <lockstep/torch/zero.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <lockstep_models/models.h>
#include <lockstep_option_checks/option_checks.h>
#include "dataset.h"

namespace {

using Clock = std::chrono::steady_clock;
using examples::ConvNetImpl;

struct Options {
  int epochs = 2;
  int batch_size = 64;  // per rank
  double lr = 0.05;
  double momentum = 0.9;
  double bucket_cap_mb = 25;
  bool autotune_buckets = false;
  std::string backend;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint = "fashion_mnist.ckpt";
  bool fresh = false;
  std::size_t subset = 0;    // train on the first N samples only (0: all)
  std::size_t test_subset = 0;
  int max_steps = 0;         // stop each epoch after N steps (0: no limit)
  std::string save_params;   // write the final parameters here
  std::uint64_t seed = 1;
  bool progress = true;
  bool batch_norm = false;
  bool sync_batch_norm = false;
  bool zero = false;
  bool double_precision = false;  // train in float64 (--double)
  double progress_every = 10;  // seconds between progress lines in a log
  int checkpoint_every = 0;    // steps between mid-epoch checkpoints (0: epoch ends only)
};

// SGD with momentum, or its sharded form (--zero). Both save and load the
// same checkpoint format; the sharded one gathers its state on rank 0
// first (prepare_save, collective).
class Optimizer {
 public:
  Optimizer(std::vector<torch::Tensor> params, const torch::optim::SGDOptions& options,
            std::shared_ptr<lockstep::ProcessGroup> pg, bool zero) {
    if (zero)
      sharded_ = std::make_unique<lockstep::torch::ZeroRedundancyOptimizer>(std::move(params), std::move(pg), options);
    else
      plain_ = std::make_unique<torch::optim::SGD>(std::move(params), options);
  }
  void zero_grad() { plain_ ? plain_->zero_grad() : sharded_->zero_grad(); }
  void step() {
    if (plain_)
      plain_->step();
    else
      sharded_->step();
  }
  void prepare_save() {
    if (sharded_) sharded_->consolidate_state_dict(0);
  }
  void save(torch::serialize::OutputArchive& out) { plain_ ? plain_->save(out) : sharded_->save(out); }
  void load(torch::serialize::InputArchive& in) { plain_ ? plain_->load(in) : sharded_->load(in); }

 private:
  std::unique_ptr<torch::optim::SGD> plain_;
  std::unique_ptr<lockstep::torch::ZeroRedundancyOptimizer> sharded_;
};

// Where training stands: what a checkpoint holds besides the model.
struct Position {
  int epoch = 0;                // epochs done
  std::size_t samples_done = 0;  // samples of epoch `epoch` done, over all ranks
};

double since_ms(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Training that diverged would otherwise go on to its end and exit 0 with
// "train loss nan"; it stops at the first step whose loss is not finite.
void check_loss(double loss, int step, int epoch, int rank) {
  if (std::isfinite(loss)) return;
  // "nan", never "-nan": the sign of a NaN means nothing.
  const char* value = std::isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf";
  throw std::runtime_error("the loss became " + std::string(value) + " at step " + std::to_string(step) +
                           " of epoch " + std::to_string(epoch) + " on rank " + std::to_string(rank) +
                           "; lower --lr or check the data");
}

double sum_over_ranks(lockstep::ProcessGroup& pg, double v) {
  pg.allreduce(lockstep::Buffer{&v, 1, lockstep::DType::f64}, lockstep::ReduceOp::sum)->wait();
  return v;
}

// A log gets one line per update; a terminal a bar redrawn in place.
void draw_progress(int epoch, int epochs, std::size_t done, std::size_t total, double samples_per_s, double loss) {
  if (!isatty(STDOUT_FILENO)) {
    std::printf("epoch %d/%d: %zu/%zu samples (%.0f%%) | %.0f samples/s | loss %.4f\n", epoch, epochs, done, total,
                total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0, samples_per_s, loss);
    std::fflush(stdout);
    return;
  }
  constexpr int kWidth = 30;
  const int filled = total ? static_cast<int>(kWidth * static_cast<double>(done) / static_cast<double>(total)) : kWidth;
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::printf("\repoch %d/%d [%s] %3.0f%% %zu/%zu samples | %.0f samples/s | loss %.4f ", epoch, epochs, bar.c_str(),
              total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0, done, total,
              samples_per_s, loss);
  std::fflush(stdout);
}

// Correct predictions and images seen on this rank's exact shard of the test set.
std::pair<double, double> evaluate(examples::ConvNetImpl& model, fashion_mnist::Dataset test, torch::Dtype dtype, int rank,
                                   int ranks) {
  lockstep::torch::DistributedSampler sampler(
      {.dataset_size = *test.size(), .num_replicas = ranks, .rank = rank, .shuffle = false, .exact = true});
  auto loader = torch::data::make_data_loader(test.map(torch::data::transforms::Stack<>()), sampler, 500);
  torch::NoGradGuard no_grad;
  model.eval();
  double correct = 0, seen = 0;
  for (auto& batch : *loader) {
    correct += model.forward(batch.data.to(dtype)).argmax(1).eq(batch.target).sum().item<double>();
    seen += static_cast<double>(batch.data.size(0));
  }
  model.train();
  return {correct, seen};
}

// Model, optimizer and position from the checkpoint, if there is one.
void load_training_state(const std::string& path, ConvNetImpl& model, Optimizer& optimizer, Position& at, int ranks,
                         bool leader) {
  lockstep::torch::load_checkpoint(path, [&](torch::serialize::InputArchive& in) {
    model.load(in);
    torch::serialize::InputArchive opt;
    in.read("optimizer", opt);
    optimizer.load(opt);
    torch::Tensor epoch, samples;
    in.read("epochs_done", epoch, /*is_buffer=*/true);
    at.epoch = static_cast<int>(epoch.item<std::int64_t>());
    // Checkpoints written only at epoch ends have no position inside one.
    if (in.try_read("samples_done", samples, /*is_buffer=*/true))
      at.samples_done = static_cast<std::size_t>(samples.item<std::int64_t>());
    if (leader)
      std::printf("resuming from %s: %d epoch(s) already done%s; now on %d rank(s)\n", path.c_str(), at.epoch,
                  at.samples_done ? (", and " + std::to_string(at.samples_done) + " sample(s) of epoch " +
                                     std::to_string(at.epoch + 1)).c_str()
                                  : "",
                  ranks);
  });
}

void save_training_state(const std::string& path, ConvNetImpl& model, Optimizer& optimizer, const Position& at) {
  lockstep::torch::save_checkpoint(path, [&](torch::serialize::OutputArchive& out) {
    model.save(out);
    torch::serialize::OutputArchive opt;
    optimizer.save(opt);
    out.write("optimizer", opt);
    out.write("epochs_done", torch::tensor(static_cast<std::int64_t>(at.epoch)), /*is_buffer=*/true);
    out.write("samples_done", torch::tensor(static_cast<std::int64_t>(at.samples_done)), /*is_buffer=*/true);
  });
}

int train(const Options& o) {
  at::set_num_threads(1);  // one core per rank (the launcher sets OMP_NUM_THREADS=1 too)
  lockstep::GroupOptions group;
  group.backend = o.backend;
  auto pg = lockstep::init_process_group(group);
  const int rank = pg->rank(), ranks = pg->size();
  const bool leader = rank == 0;

  fashion_mnist::Dataset train_set(o.data, /*train=*/true, o.subset);
  fashion_mnist::Dataset test_set(o.data, /*train=*/false, o.test_subset);
  torch::manual_seed(static_cast<std::uint64_t>(o.seed));
  auto model = std::make_shared<ConvNetImpl>(o.batch_norm || o.sync_batch_norm);
  if (o.sync_batch_norm) lockstep::torch::convert_sync_batchnorm(model, pg);
  const torch::Dtype dtype = o.double_precision ? torch::kDouble : torch::kFloat;
  model->to(dtype);
  Optimizer optimizer(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum), pg, o.zero);

  // Resume: every rank reads the checkpoint (same host or shared disk). A
  // first attempt with --fresh ignores it; restarts of the job always resume.
  const char* restart = std::getenv("LOCKSTEP_RESTART_COUNT");
  const bool restarted = restart && std::string(restart) != "0";
  Position start;
  if (!o.fresh || restarted) {
    try {
      load_training_state(o.checkpoint, *model, optimizer, start, ranks, leader);
    } catch (const lockstep::Error& e) {
      // The library cannot know this program's flags; here --fresh is the
      // way out, unless something other than a file (which a save cannot
      // replace) is in the checkpoint's place.
      if (!std::filesystem::is_regular_file(o.checkpoint)) throw;
      throw lockstep::Error(std::string(e.what()) + " (or pass --fresh, which ignores it and overwrites it)");
    }
  }
  lockstep::torch::DDPOptions ddp_options;
  ddp_options.bucket_cap_mb = o.bucket_cap_mb;
  ddp_options.autotune_bucket_cap = o.autotune_buckets;
  lockstep::torch::DistributedDataParallel<ConvNetImpl> ddp(model, pg, ddp_options);

  if (start.samples_done >= *train_set.size()) start = {start.epoch + 1, 0};  // saved at the epoch's very end
  const int first_epoch = start.epoch;
  std::size_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += static_cast<std::size_t>(p.numel());
  if (leader)
    std::printf("training a %.1fM-parameter convnet on %zu Fashion-MNIST images: %d rank(s) x batch %d, %s backend\n",
                static_cast<double>(parameters) / 1e6, *train_set.size(), ranks, o.batch_size, pg->backend().c_str());
  if (first_epoch >= o.epochs && leader)
    std::printf("nothing to do: the checkpoint has %d epoch(s), --epochs is %d\n", first_epoch, o.epochs);
  // At once, not when the buffer fills: under a launcher stdout is a pipe,
  // and whoever watches the log learns that training has begun.
  std::fflush(stdout);

  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    // A resumed epoch deals only the samples not yet trained on, to however
    // many ranks there are now.
    const std::size_t resume_at = epoch == first_epoch ? start.samples_done : 0;
    lockstep::torch::DistributedSampler sampler({.dataset_size = *train_set.size(), .num_replicas = ranks,
                                                 .rank = rank, .seed = o.seed, .resume_at = resume_at});
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    auto loader = torch::data::make_data_loader(train_set.map(torch::data::transforms::Stack<>()), sampler,
                                                torch::data::DataLoaderOptions(static_cast<std::size_t>(o.batch_size)));
    const auto epoch_start = Clock::now();
    double loss_sum = 0, samples = 0, data_ms = 0, exposed_ms = 0, step_ms = 0;
    int steps = 0;
    auto last_draw = Clock::now();
    const double draw_every = isatty(STDOUT_FILENO) ? 0.5 : o.progress_every;
    auto fetch = Clock::now();
    auto loading = ddp.data_timer();  // the loader fetches inside the range-for
    for (auto& batch : *loader) {
      loading.stop();
      data_ms += since_ms(fetch);
      const auto step_start = Clock::now();
      optimizer.zero_grad();
      auto loss = torch::cross_entropy_loss(ddp.forward(batch.data.to(dtype)), batch.target);
      // The loss is read every step for the epoch's average anyway (on the
      // CPU, where this example trains, item() waits for nothing), so
      // checking it costs nothing. It is checked before backward: once the
      // parameters have diverged (they are the same on every rank) every
      // rank stops at the same step, before the step's all-reduce, rather
      // than one rank leaving the others waiting in it.
      const double step_loss = loss.item<double>();
      check_loss(step_loss, steps + 1, epoch + 1, rank);
      loss.backward();
      optimizer.step();
      step_ms += since_ms(step_start);
      exposed_ms += ddp.last_step().backward.exposed_communication_ms();
      const double n = static_cast<double>(batch.data.size(0));
      loss_sum += step_loss * n;
      samples += n;
      ++steps;
      if (leader && o.progress && std::chrono::duration<double>(Clock::now() - last_draw).count() > draw_every) {
        const double rate = samples * ranks / std::chrono::duration<double>(Clock::now() - epoch_start).count();
        draw_progress(epoch + 1, o.epochs, resume_at + static_cast<std::size_t>(samples) * static_cast<std::size_t>(ranks),
                      resume_at + sampler.num_samples() * static_cast<std::size_t>(ranks), rate, loss_sum / samples);
        last_draw = Clock::now();
      }
      // Every rank has done `steps` full batches: that many samples of the
      // epoch's order are behind the model now.
      if (o.checkpoint_every > 0 && steps % o.checkpoint_every == 0) {
        optimizer.prepare_save();  // collective with --zero: every rank reaches it at the same step
        if (leader)
          save_training_state(o.checkpoint, *model, optimizer,
                              {epoch, resume_at + static_cast<std::size_t>(steps * o.batch_size * ranks)});
      }
      if (o.max_steps > 0 && steps >= o.max_steps) break;
      fetch = Clock::now();
      loading.restart();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    // Averages over every rank's steps.
    const double all_samples = sum_over_ranks(*pg, samples);
    const double train_loss = sum_over_ranks(*pg, loss_sum) / all_samples;
    const double all_steps = sum_over_ranks(*pg, steps);
    const double mean_step = sum_over_ranks(*pg, step_ms) / all_steps;
    const double mean_exposed = sum_over_ranks(*pg, exposed_ms) / all_steps;
    const double mean_data = sum_over_ranks(*pg, data_ms) / all_steps;
    const auto [correct, seen] = evaluate(*model, test_set, dtype, rank, ranks);
    const double all_correct = sum_over_ranks(*pg, correct), all_seen = sum_over_ranks(*pg, seen);
    optimizer.prepare_save();
    if (leader) {
      if (o.progress) {
        const auto total = resume_at + static_cast<std::size_t>(all_samples);
        draw_progress(epoch + 1, o.epochs, total, total, all_samples / seconds, train_loss);
        if (isatty(STDOUT_FILENO)) std::printf("\n");
      }
      std::printf("epoch %d/%d: train loss %.4f, test accuracy %.2f%% (%.0f images), %.0f samples/s over %d rank(s)\n",
                  epoch + 1, o.epochs, train_loss, 100.0 * all_correct / all_seen, all_seen, all_samples / seconds, ranks);
      std::printf("  step %.1f ms = compute %.1f ms + exposed communication %.1f ms; data loading %.1f ms per step\n",
                  mean_step, mean_step - mean_exposed, mean_exposed, mean_data);
      save_training_state(o.checkpoint, *model, optimizer, {epoch + 1, 0});
      std::printf("  checkpoint: %s (epoch %d)\n", o.checkpoint.c_str(), epoch + 1);
      std::fflush(stdout);
    }
    pg->barrier()->wait();  // nobody resumes from a checkpoint rank 0 is still writing
  }
  if (!o.save_params.empty() && leader) {
    torch::serialize::OutputArchive out;
    model->save(out);
    out.save_to(o.save_params);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace checks = lockstep::option_checks;
  CLI::App app{"Train a convnet on Fashion-MNIST with lockstep DistributedDataParallel"};
  Options o;
  app.add_option("--epochs", o.epochs, "Epochs to train")->capture_default_str()->check(checks::positive_count());
  app.add_option("--batch-size", o.batch_size, "Samples per rank per step")
      ->capture_default_str()
      ->check(checks::positive_count());
  app.add_option("--lr", o.lr, "SGD learning rate")->capture_default_str()->check(checks::positive_number());
  // Momentum is the share of the last update kept in the next: above 1
  // the updates grow without end.
  app.add_option("--momentum", o.momentum, "SGD momentum, from 0 to 1")
      ->capture_default_str()
      ->check(checks::number_in(0, 1));
  // Up to 1 TiB: the cap is converted to bytes.
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "DDP bucket size cap")
      ->capture_default_str()
      ->check(checks::positive_number(1 << 20));
  app.add_flag("--autotune-buckets", o.autotune_buckets,
               "Choose the bucket cap from the first steps' measurements (DDPOptions::autotune_bucket_cap)");
  app.add_option("--backend", o.backend, "auto, shm, tcp, hier, mpi (default: LOCKSTEP_BACKEND or auto)");
  app.add_option("--data", o.data, "Directory with the Fashion-MNIST IDX files")->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint, "Checkpoint file (written each epoch, resumed from)")->capture_default_str();
  app.add_flag("--fresh", o.fresh, "Ignore an existing checkpoint on the first attempt (restarts still resume)");
  // Counts stored unsigned are checked as signed numbers: "-5" must not wrap.
  app.add_option("--subset", o.subset, "Train on the first N images only (0: all)")
      ->check(checks::non_negative_whole_number());
  app.add_option("--test-subset", o.test_subset, "Test on the first N images only (0: all)")
      ->check(checks::non_negative_whole_number());
  app.add_option("--max-steps", o.max_steps, "Stop each epoch after N steps (0: no limit)")
      ->check(checks::non_negative_count());
  app.add_option("--save-params", o.save_params, "Write the final parameters to this file");
  app.add_option("--seed", o.seed, "Seed for initialisation and shuffling")
      ->capture_default_str()
      ->check(checks::non_negative_whole_number());
  app.add_option("--progress", o.progress, "Draw a progress bar (1) or not (0)")->capture_default_str();
  app.add_flag("--batchnorm", o.batch_norm, "Batch normalisation after each conv, over each rank's batch");
  app.add_flag("--sync-batchnorm", o.sync_batch_norm,
               "Batch normalisation after each conv, over the global batch (SyncBatchNorm; implies --batchnorm)");
  app.add_flag("--double", o.double_precision,
               "Train in float64 (slower): N ranks then match one rank to ~1e-15 whatever the CPU's kernels, "
               "where float32 differs by their rounding (the equivalence test uses it)");
  app.add_flag("--zero", o.zero, "Shard the optimizer state across ranks (ZeroRedundancyOptimizer)");
  app.add_option("--progress-every", o.progress_every, "Seconds between progress lines when stdout is not a terminal")
      ->capture_default_str()
      ->check(checks::non_negative_number(86400));
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "Also checkpoint every N steps, so a restart loses at most N steps (0: at epoch ends only)")
      ->capture_default_str()
      ->check(checks::non_negative_count());
  CLI11_PARSE(app, argc, argv);
  try {
    return train(o);
  } catch (const lockstep::Error& e) {
    // lockstep's errors (a bad launcher environment, an unreadable
    // checkpoint, a dead peer) say what to do: exit 2, as `lockstep` does.
    lockstep::record_error(e);  // TORCHELASTIC_ERROR_FILE, for the launcher's report
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    lockstep::record_error(e);  // TORCHELASTIC_ERROR_FILE, for the launcher's report
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
