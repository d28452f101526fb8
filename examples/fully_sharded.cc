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
//
// --resilient survives a rank's death in place (docs/fsdp.md, "Backup
// shards"): each rank keeps its ring predecessor's shards with a
// lockstep::torch::ShardBackup, and lockstep::torch::ShardedResilientTrainer
// takes the steps, each global batch cut into one logical shard per rank
// (each shard's samples from its own sampler, the same whoever computes
// them). Kill a rank and the others go on without it, the dead rank's
// successor holding its shard, and end with the shards of a run without
// the failure, bit for bit. The group's first rank reports the median step
// time on the whole group and after each loss (held steps: the successor
// computes two shards), and the time of each step that saw a loss:
//   build/lockstep run --nproc-per-node 4 --on-rank-failure continue -- \
//     build/examples/fully_sharded --resilient --steps 200 --kill 2:50:barrier --save-shards /tmp/shards
// --kill R:S:PHASE (repeatable) makes world rank R kill itself (SIGKILL)
// at step S at that phase: forward (between its forward and backward), or
// a phase of ShardedResilientOptions::observer (shard, backup, barrier,
// commit, committed, re-formed: after the survivors of a loss agreed, in
// the step S taken again), or before the checkpoint written after step S
// (checkpoint), or while a replacement is fed, at the first feeding after
// step S (feed), in the launcher's first round only. --save-shards DIR
// writes each shard's parameters a rank holds at the end to
// DIR/shard<k>.bin, for comparing runs. With --checkpoint, --checkpoint-every
// K writes the sharded checkpoint every K steps while the group is whole;
// after a loss the survivors re-form the backup ring, so a later death is
// taken over too, but what the trainer cannot survive (two neighbours of
// the ring at once, a death while the ring is re-formed) ends the job, and
// the launcher's restart resumes from the checkpoint:
//   build/lockstep run --nproc-per-node 4 --on-rank-failure continue --max-restarts 1 -- \
//     build/examples/fully_sharded --resilient --steps 200 --checkpoint /tmp/ckpt --checkpoint-every 20 \
//     --kill 1:50:forward --kill 2:50:forward
// With --max-replacements the launcher starts a new process for a dead
// rank; the survivors admit it once a replacement waits for every lost
// rank, feed it its shard from their memory, and train on the whole job
// again. --kill-replacement R:I:K:PHASE makes replacement I of world rank R
// kill itself K steps after it joined (PHASE as --kill's), or while it is
// fed (PHASE feed, K ignored):
//   build/lockstep run --nproc-per-node 3 --on-rank-failure continue --max-replacements 3 -- \
//     build/examples/fully_sharded --resilient --steps 300 --kill 1:20:forward --kill-replacement 1:1:20:barrier
#include <lockstep/error.h>
#include <lockstep/process_group.h>
#include <lockstep/torch/data.h>
#include <lockstep/torch/fully_shard.h>
#include <lockstep/torch/resilient_fsdp.h>
#include <lockstep/torch/shard_backup.h>
#include <lockstep/torch/zero.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "fashion_mnist/dataset.h"
#include "fashion_mnist/shard_batches.h"
#include "launch_info.h"

namespace {

using examples::first_round;
using examples::incarnation;
using examples::launcher_round;
using examples::process_started_at;
using examples::wall_clock_now;

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
  int checkpoint_every = 0;  // --resilient: steps between checkpoints (0: at the end only)
  bool reshard_after_forward = true;
  bool resilient = false;
  std::vector<std::string> kills;  // --kill R:S:PHASE
  std::vector<std::string> replacement_kills;  // --kill-replacement R:I:K:PHASE
  std::string save_shards;
  double step_ms = 0;  // a pause after each step (a slower model, for demonstrations and tests)
  int halve_lr_at = 0;  // --halve-lr-at: the learning rate halved once STEP steps have committed (0: never)
};

// Where a rank kills itself: world rank `rank`, at step `step`, phase `phase`.
struct Kill {
  int rank = -1;
  std::uint64_t step = 0;
  std::string phase;
};

const std::vector<std::string> kKillPhases = {"forward",   "shard",     "backup",     "barrier", "commit",
                                              "committed", "re-formed", "checkpoint", "feed"};

std::vector<Kill> parse_kills(const std::vector<std::string>& specs) {
  const std::vector<std::string>& phases = kKillPhases;
  std::vector<Kill> out;
  for (const std::string& spec : specs) {
    std::istringstream in(spec);
    Kill k;
    char colon1 = 0, colon2 = 0;
    in >> k.rank >> colon1 >> k.step >> colon2;
    std::getline(in, k.phase);
    if (!in.eof() || colon1 != ':' || colon2 != ':' || k.rank < 0 ||
        std::find(phases.begin(), phases.end(), k.phase) == phases.end())
      throw lockstep::InvalidArgument(fmt::format("--kill {}: expected RANK:STEP:PHASE, PHASE one of {}", spec,
                                                  fmt::join(phases, ", ")));
    out.push_back(k);
  }
  return out;
}

// --kill-replacement: as --kill's phases, and "feed": while its peers feed it.
using examples::ReplacementKill;

std::vector<ReplacementKill> parse_replacement_kills(const std::vector<std::string>& specs) {
  return examples::parse_replacement_kills(specs, [](const std::string& phase) {
    if (std::find(kKillPhases.begin(), kKillPhases.end(), phase) == kKillPhases.end())
      throw lockstep::InvalidArgument(
          fmt::format("--kill-replacement: the phase '{}' is none of {}", phase, fmt::join(kKillPhases, ", ")));
  });
}

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

// The test images once, each rank its share: the accuracy.
template <typename Model>
double test_accuracy(const Options& o, Model& model, lockstep::ProcessGroup& pg) {
  fashion_mnist::Dataset test(o.data, false, o.subset ? o.subset / 6 : 0);
  lockstep::torch::DistributedSampler test_sampler(
      {.dataset_size = *test.size(), .num_replicas = pg.size(), .rank = pg.rank(), .shuffle = false, .exact = true});
  auto test_loader = torch::data::make_data_loader(test.map(torch::data::transforms::Stack<>()), test_sampler, 500);
  double counts[2] = {0, 0};  // correct, seen
  {
    torch::NoGradGuard no_grad;
    for (auto& batch : *test_loader) {
      const torch::Tensor logits = model.forward(batch.data);
      counts[0] += logits.argmax(1).eq(batch.target).sum().item<double>();
      counts[1] += static_cast<double>(batch.data.size(0));
    }
  }
  pg.allreduce(lockstep::Buffer{counts, 2, lockstep::DType::f64})->wait();
  return counts[0] / counts[1];
}

// --resilient: each step's time, by the size of the group it ran on (and
// whether replacements grew it back), to tell what the held steps after a
// loss, and after replacements joined, cost against the whole group's.
// A step that saw a loss is apart: its time is the failure's, the re-form
// and the step taken again.
class StepTimes {
 public:
  void add(int ranks, bool grown_back, bool saw_loss, double seconds) {
    if (saw_loss)
      recoveries_.push_back(seconds);
    else
      by_group_[{ranks, grown_back}].push_back(seconds);
  }
  // Medians, the whole group's first; its first step (its first gathers
  // and allocations) is left out, as ddp_throughput's warm-up is.
  void print(int job_size) const {
    for (auto it = by_group_.rbegin(); it != by_group_.rend(); ++it) {
      const auto [ranks, grown_back] = it->first;
      std::vector<double> t = it->second;
      if (ranks == job_size && !grown_back && !t.empty()) t.erase(t.begin());
      if (t.empty()) continue;
      std::printf("step time on %d of %d ranks%s: median %.1f ms over %zu steps\n", ranks, job_size,
                  grown_back ? ", grown back by replacements" : "", 1e3 * median(t), t.size());
    }
    for (double r : recoveries_) std::printf("a step that saw a loss: %.1f ms\n", 1e3 * r);
  }

 private:
  static double median(std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  std::map<std::pair<int, bool>, std::vector<double>> by_group_;
  std::vector<double> recoveries_;
};

// --resilient: the steps by ShardedResilientTrainer, one logical shard per
// rank; a killed rank's shard goes on with its successor.
template <typename Model>
int train_resilient(const Options& o, lockstep::ProcessGroup& pg, const std::shared_ptr<Model>& model,
                    torch::optim::Optimizer& optimizer, std::uint64_t resumed_steps) {
  const int world_rank = pg.world_ranks()[static_cast<std::size_t>(pg.rank())];
  const bool replacement = pg.joined();
  std::vector<Kill> kills;
  for (const Kill& k : parse_kills(o.kills))
    if (k.rank == world_rank && first_round() && !replacement) kills.push_back(k);
  std::vector<ReplacementKill> replacement_kills;
  for (const ReplacementKill& k : parse_replacement_kills(o.replacement_kills))
    if (k.rank == world_rank && k.incarnation == incarnation() && replacement) replacement_kills.push_back(k);
  for (const ReplacementKill& k : replacement_kills)
    if (k.phase == "feed") kills.push_back(Kill{k.rank, 0, "feed"});  // its peers' step, whatever it is
  const auto die_if_asked = [&](std::string_view phase, std::uint64_t step) {
    for (const Kill& k : kills)
      if (k.phase == phase && (phase == "feed" ? step >= k.step : step == k.step)) {
        std::printf("rank %d: killed at step %llu, %s, at %.6f\n", world_rank, static_cast<unsigned long long>(step),
                    k.phase.c_str(), wall_clock_now());
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
  };
  fashion_mnist::Dataset train(o.data, true, o.subset);
  fashion_mnist::ShardBatches batches(train, pg.size(), o.batch_size);
  lockstep::torch::ShardBackup backup(*model, optimizer);
  lockstep::torch::ShardedResilientOptions options;
  options.first_step = resumed_steps;
  // "committed" is said with the count after the step: step S's is S + 1.
  double feed_started = 0, fed_at = 0;
  options.observer = [&](std::string_view phase, std::uint64_t step) {
    if (phase == "feed") feed_started = wall_clock_now();
    if (phase == "fed") fed_at = wall_clock_now();
    die_if_asked(phase, phase == "committed" ? step - 1 : step);
  };
  lockstep::torch::ShardedResilientTrainer trainer(model, optimizer, backup, options);
  if (replacement) {
    const double now = wall_clock_now();
    // What it was fed: its shard's parameters and their optimizer state.
    std::int64_t fed_bytes = static_cast<std::int64_t>(lockstep::torch::optimizer_state_bytes(optimizer));
    for (const auto& p : model->parameters()) fed_bytes += bytes_of(p);
    std::printf("world rank %d (replacement %d): joined at step %llu, fed its shard (%.1f MB) by its peers in %.4f s "
                "(the ring of copies re-formed in %.3f s more); holds shards %s; training at %.6f (process started "
                "at %.2f)\n",
                world_rank, incarnation(), static_cast<unsigned long long>(trainer.steps_committed()),
                static_cast<double>(fed_bytes) / 1e6, fed_at - feed_started, now - fed_at,
                fmt::format("{}", trainer.shards()).c_str(), now, process_started_at());
    for (const ReplacementKill& k : replacement_kills)
      if (k.phase != "feed") kills.push_back(Kill{k.rank, trainer.steps_committed() + k.after, k.phase});
  }
  const auto checkpoint_due = [&](std::uint64_t steps) {
    return o.checkpoint_every > 0 && steps % static_cast<std::uint64_t>(o.checkpoint_every) == 0;
  };
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0;
  StepTimes times;
  while (trainer.steps_committed() < static_cast<std::uint64_t>(o.steps)) {
    const int ranks_before = trainer.group().size();
    const bool grown_back = ranks_before == pg.job_size() && (replacement || trainer.lost_rank() >= 0);
    const auto step_start = std::chrono::steady_clock::now();
    const auto outcome = trainer.step([&](const lockstep::torch::Shard& shard) {
      auto [x, y] = batches.batch(shard.index, shard.step);
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      die_if_asked("forward", shard.step);
      return loss;
    });
    times.add(ranks_before, grown_back, !outcome.lost.empty(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
    if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.step_ms));
    for (int lost : outcome.lost)
      std::printf("rank %d: step %llu went on without rank %d, re-formed in %.2f s; holding shards %s\n",
                  world_rank, static_cast<unsigned long long>(outcome.step), lost, outcome.recovery_seconds,
                  fmt::format("{}", trainer.shards()).c_str());
    for (int joined : outcome.joined)
      std::printf("rank %d: after step %llu world rank %d joined again; holding shards %s\n", world_rank,
                  static_cast<unsigned long long>(outcome.step), joined, fmt::format("{}", trainer.shards()).c_str());
    for (double l : outcome.losses) loss_sum += l / static_cast<double>(outcome.losses.size());
    // An event, as ReduceLROnPlateau's: a replacement that joins later
    // never sees it here, and has the halved rate from its peers.
    if (o.halve_lr_at > 0 && trainer.steps_committed() == static_cast<std::uint64_t>(o.halve_lr_at))
      for (auto& group : optimizer.param_groups()) group.options().set_lr(group.options().get_lr() / 2);
    if (trainer.steps_committed() % 50 == 0 && trainer.group().rank() == 0) {
      std::printf("step %llu: loss %.4f (rank 0's shards)\n",
                  static_cast<unsigned long long>(trainer.steps_committed()), loss_sum / 50);
      loss_sum = 0;
    }
    // After a loss the shards live on fewer ranks than the checkpoint's
    // files are for: the last one written stays the one to restart from.
    if (checkpoint_due(trainer.steps_committed()) && trainer.lost_rank() < 0 && !replacement) {
      die_if_asked("checkpoint", trainer.steps_committed() - 1);
      lockstep::torch::save_sharded_checkpoint(*model, o.checkpoint, &optimizer, trainer.steps_committed());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!o.save_shards.empty())
    for (int shard : trainer.shards()) {
      std::ofstream out(fmt::format("{}/shard{}.bin", o.save_shards, shard), std::ios::binary);
      for (const torch::Tensor& block : trainer.shard_blocks(shard)) {
        const torch::Tensor c = block.contiguous();
        out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
      }
      if (!out) throw std::runtime_error(fmt::format("could not write {}/shard{}.bin", o.save_shards, shard));
    }
  if (trainer.group().rank() == 0) times.print(pg.job_size());
  if (trainer.lost_rank() < 0 && !replacement) {
    const double accuracy = test_accuracy(o, *model, pg);
    if (pg.rank() == 0) std::printf("%d steps in %.1f s; test accuracy %.2f%%\n", o.steps, seconds, 100 * accuracy);
    if (!o.checkpoint.empty() && !checkpoint_due(trainer.steps_committed()))  // not written just now
      lockstep::torch::save_sharded_checkpoint(*model, o.checkpoint, &optimizer, trainer.steps_committed());
  } else if (trainer.group().rank() == 0) {
    std::printf("%d steps in %.1f s, the last on %d of %d ranks; test accuracy not measured: the model's forward "
                "outside the trainer needs the group it was made on, which lost %s%s\n",
                o.steps, seconds, trainer.group().size(), pg.job_size(),
                replacement ? "this rank's predecessor" : fmt::format("rank {}", trainer.lost_rank()).c_str(),
                o.checkpoint.empty() ? "" : "; the checkpoint is the last written before the loss");
  }
  return 0;
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
  std::uint64_t resumed_steps = 0;
  // A replacement is fed by its peers (--resilient): no checkpoint is read.
  if (!o.checkpoint.empty() && !pg->joined() &&
      lockstep::torch::load_sharded_checkpoint(*model, o.checkpoint, &optimizer, &resumed_steps) && rank == 0)
    std::printf("resumed from %s.rank<r>-of-%d after %llu steps\n", o.checkpoint.c_str(), ranks,
                static_cast<unsigned long long>(resumed_steps));
  if (o.resilient) return train_resilient(o, *pg, model, optimizer, resumed_steps);

  fashion_mnist::Dataset train(o.data, true, o.subset);
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

  const double accuracy = test_accuracy(o, *model, *pg);

  const std::int64_t held = held_bytes(*model, optimizer);
  // The whole model's parameters, gradients and Adam's two moments, in fp32.
  const std::int64_t whole = model_elements * 4 * 4;
  std::vector<double> all_held(static_cast<std::size_t>(ranks), 0.0);
  all_held[static_cast<std::size_t>(rank)] = mib(held);
  pg->allreduce(lockstep::Buffer{all_held.data(), all_held.size(), lockstep::DType::f64})->wait();
  if (rank == 0) {
    std::printf("%d steps in %.1f s; test accuracy %.2f%%\n", step, seconds, 100 * accuracy);
    std::printf("model: %lld parameters; parameters, gradients and Adam state in full: %.1f MiB\n",
                static_cast<long long>(model_elements), mib(whole));
    for (int r = 0; r < ranks; ++r)
      std::printf("rank %d holds %.1f MiB (%.2f of the whole)\n", r, all_held[static_cast<std::size_t>(r)],
                  all_held[static_cast<std::size_t>(r)] / mib(whole));
  }
  if (!o.checkpoint.empty())
    lockstep::torch::save_sharded_checkpoint(*model, o.checkpoint, &optimizer,
                                             resumed_steps + static_cast<std::uint64_t>(step));
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
  auto* resilient = app.add_flag("--resilient", o.resilient,
                                 "survive a rank's death in place: ShardBackup and ShardedResilientTrainer, one "
                                 "logical shard per rank (lockstep run --on-rank-failure continue)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "with --resilient: write the checkpoint every K steps while no rank is lost, to restart from what "
                 "the trainer cannot survive")
      ->check(CLI::Range(1, 10000000))
      ->needs(resilient)
      ->needs(app.get_option("--checkpoint"));
  app.add_option("--halve-lr-at", o.halve_lr_at,
                 "with --resilient: halve the learning rate once STEP steps have committed (an event, as a plateau "
                 "would make it: a replacement joining later gets the rate from its peers)")
      ->check(CLI::Range(1, 10000000))
      ->needs(resilient);
  app.add_option("--kill", o.kills,
                 "RANK:STEP:PHASE: world rank RANK kills itself at step STEP (from 0), PHASE one of forward, "
                 "shard, backup, barrier, commit, committed, re-formed, checkpoint (before the checkpoint after step "
                 "STEP), feed (while a replacement is fed, at the first feeding from step STEP on; repeatable; tests "
                 "and demonstrations)")
      ->needs(resilient);
  app.add_option("--kill-replacement", o.replacement_kills,
                 "RANK:INCARNATION:STEPS:PHASE: replacement INCARNATION (from 1) of world rank RANK kills itself STEPS "
                 "steps after it joined, PHASE as --kill's, or while its peers feed it (feed; STEPS ignored; "
                 "repeatable)")
      ->needs(resilient);
  app.add_option("--step-ms", o.step_ms,
                 "with --resilient: pause this long after each step, as a slower model would (its time is not in the "
                 "step times; demonstrations and tests that need a replacement to arrive before the end)")
      ->check(CLI::NonNegativeNumber)
      ->needs(resilient);
  app.add_option("--save-shards", o.save_shards, "write each held shard's parameters to DIR/shard<k>.bin at the end")
      ->check(CLI::ExistingDirectory)
      ->needs(resilient);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fully_sharded: %s\n", e.what());
    return 1;
  }
}
