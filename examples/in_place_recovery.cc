// Training that survives a rank's death in place (docs/faults.md): an MLP
// on Fashion-MNIST through lockstep::torch::ResilientTrainer. Kill a rank
// and the others go on in the same processes, share out its shards, redo
// the step it interrupted, and end with the parameters a run without the
// failure ends with, bit for bit:
//   build/lockstep run --nproc-per-node 4 --on-rank-failure continue -- \
//     build/examples/in_place_recovery --steps 200 --save-params /tmp/params.bin
//
// The global batch (--batch) is cut into one logical shard per rank at
// start (--shards-per-rank for more); each shard's samples come from its
// own DistributedSampler (the shard's index as its rank), so they are the
// same whoever computes them.
// The loop changes from a DDP loop by these lines: the step function, and
// the batch chosen by shard instead of by rank.
//
// --checkpoint PATH --checkpoint-every K: the first rank of the group
// writes the model, the optimizer and the step count there (atomically)
// every K steps, and every rank resumes from it at start; that is what the
// restart (--on-rank-failure restart --max-restarts N) needs and what the
// in-place mode does not (bench/in_place_recovery.py compares the two).
// --plain trains with lockstep's DistributedDataParallel instead, one
// shard per rank and no recovery: the step time the mode is measured
// against.
//
// For tests and demonstrations, --kill R:S:PHASE (repeatable) makes world
// rank R kill itself (SIGKILL) at step S at that phase of the step
// (forward, backward, checkpoint: inside the write of the checkpoint after
// step S, or a phase of ResilientOptions::observer: reduce, bucketK,
// buffers, barrier, commit, committed, re-form), in the launcher's first round only
// (a restarted job runs clean). The victim prints the wall-clock time of
// its death and the survivors how long they took to re-form, for
// bench/in_place_recovery.py. --freeze R:S:PHASE stops the rank instead
// (SIGSTOP): its peers notice it once a collective times out
// (LOCKSTEP_TIMEOUT), wait --window seconds, and go on without it; the
// launcher then kills it.
#include <lockstep/error.h>
#include <lockstep/process_group.h>
#include <lockstep/sampler.h>
#include <lockstep/torch/data.h>
#include <lockstep/torch/ddp.h>
#include <lockstep/torch/resilient.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <vector>
#include <string>

#include "fashion_mnist/dataset.h"

namespace {

namespace nn = torch::nn;

struct Options {
  int steps = 100;
  int batch = 64;  // global, over all shards
  double lr = 0.05;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::size_t subset = 6000;
  std::string save_params;
  std::string checkpoint;
  int checkpoint_every = 0;
  bool plain = false;
  std::vector<std::string> kills;    // "rank:step:phase"
  std::vector<std::string> freezes;  // the same, SIGSTOP instead of SIGKILL
  double window = 10;                // seconds the survivors wait for a rank that does not answer
  double bucket_cap_mb = 25;         // the reduction's buckets, as DDP's bucket_cap_mb
  int shards_per_rank = 1;           // logical shards per rank at start
};

struct Kill {
  int rank = -1;
  std::uint64_t step = 0;
  std::string phase;
  int signal = SIGKILL;  // SIGSTOP: --freeze
};

std::vector<Kill> parse_kills(const std::vector<std::string>& specs, int signal) {
  static const std::set<std::string> phases = {"forward", "backward",  "reduce",  "buffers",   "barrier",
                                               "commit",  "committed", "re-form", "checkpoint"};
  std::vector<Kill> out;
  for (const std::string& spec : specs) {
    const auto a = spec.find(':'), b = spec.rfind(':');
    Kill k;
    if (a == std::string::npos || a == b) throw lockstep::InvalidArgument("--kill " + spec + ": use RANK:STEP:PHASE");
    k.rank = std::stoi(spec.substr(0, a));
    k.step = std::stoull(spec.substr(a + 1, b - a - 1));
    k.phase = spec.substr(b + 1);
    k.signal = signal;
    const bool bucket = k.phase.rfind("bucket", 0) == 0 && k.phase.size() > 6 &&
                        k.phase.find_first_not_of("0123456789", 6) == std::string::npos;
    if (!phases.count(k.phase) && !bucket)
      throw lockstep::InvalidArgument("--kill " + spec + ": the phase is one of forward, backward, reduce, buffers, "
                                      "barrier, commit, committed, re-form, checkpoint, or bucketK (before the "
                                      "reduction's bucket K, K >= 1)");
    out.push_back(k);
  }
  return out;
}

// One shard's samples, epoch by epoch: its own sampler's order, cut into
// batches of `per_shard`.
class ShardBatches {
 public:
  ShardBatches(const fashion_mnist::Dataset& data, int shards, int per_shard)
      : data_(data), shards_(shards), per_shard_(per_shard) {}

  std::pair<torch::Tensor, torch::Tensor> batch(int shard, std::uint64_t step) {
    const std::size_t per_epoch = *data_.size() / static_cast<std::size_t>(shards_) / static_cast<std::size_t>(per_shard_);
    const std::uint64_t epoch = step / per_epoch;
    auto& order = orders_[{shard, epoch}];
    if (order.empty()) {
      lockstep::DistributedSampler sampler(
          {.dataset_size = *data_.size(), .num_replicas = shards_, .rank = shard, .seed = 7, .drop_last = true});
      sampler.set_epoch(epoch);
      order = sampler.indices();
    }
    std::vector<torch::Tensor> xs, ys;
    const std::size_t first = (step % per_epoch) * static_cast<std::size_t>(per_shard_);
    for (std::size_t i = first; i < first + static_cast<std::size_t>(per_shard_); ++i) {
      auto example = const_cast<fashion_mnist::Dataset&>(data_).get(order[i]);
      xs.push_back(example.data);
      ys.push_back(example.target);
    }
    return {torch::stack(xs), torch::stack(ys)};
  }

 private:
  const fashion_mnist::Dataset& data_;
  int shards_;
  int per_shard_;
  std::map<std::pair<int, std::uint64_t>, std::vector<std::size_t>> orders_;
};

void write_params(const std::string& path, nn::Module& model) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& p : model.parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
}

using Net = nn::Sequential;

Net make_model() {
  torch::manual_seed(1);
  return nn::Sequential(nn::Flatten(), nn::Linear(28 * 28, 128), nn::ReLU(), nn::Dropout(0.1), nn::Linear(128, 10));
}

double wall_clock_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The launcher's round: kills happen in the first only.
bool first_round() {
  const char* round = std::getenv("LOCKSTEP_RESTART_COUNT");
  return round == nullptr || std::string(round) == "0";
}

// The model, the optimizer and the steps committed, from the checkpoint
// if there is one. Returns the steps.
std::uint64_t resume(const Options& o, Net& model, torch::optim::Optimizer& optimizer) {
  std::uint64_t steps = 0;
  if (o.checkpoint.empty()) return 0;
  lockstep::torch::load_checkpoint(o.checkpoint, [&](torch::serialize::InputArchive& in) {
    model->load(in);
    optimizer.load(in);
    torch::Tensor t;
    in.read("steps", t);
    steps = static_cast<std::uint64_t>(t.item<std::int64_t>());
  });
  return steps;
}

void write_checkpoint(const Options& o, Net& model, torch::optim::Optimizer& optimizer, std::uint64_t steps,
                      const std::function<void()>& midway) {
  lockstep::torch::save_checkpoint(o.checkpoint, [&](torch::serialize::OutputArchive& out) {
    model->save(out);
    midway();  // a death here leaves the last checkpoint as it was
    optimizer.save(out);
    out.write("steps", torch::tensor(static_cast<std::int64_t>(steps)));
  });
}

void report(int world_rank, int steps, std::chrono::steady_clock::time_point start, int ranks, int generation) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("world rank %d: %d steps in %.2f s, %d ranks at the end (re-formed %d time(s))\n", world_rank, steps,
              seconds, ranks, generation);
}

// lockstep's DDP on the same model and shards (shard = rank), no recovery.
int run_plain(const Options& o, std::shared_ptr<lockstep::ProcessGroup> world, ShardBatches& batches, Net& model,
              torch::optim::Optimizer& optimizer, std::uint64_t first_step,
              const std::function<void(std::string_view, std::uint64_t)>& kill_here) {
  lockstep::torch::DistributedDataParallel<nn::SequentialImpl> ddp(model.ptr(), world);
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t step = first_step; step < static_cast<std::uint64_t>(o.steps); ++step) {
    kill_here("forward", step);
    auto [x, y] = batches.batch(world->rank(), step);
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(ddp.forward(x), y).backward();
    optimizer.step();
    if (!o.checkpoint.empty() && o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0 && world->rank() == 0)
      write_checkpoint(o, model, optimizer, step + 1, [] {});
  }
  report(world->rank(), o.steps - static_cast<int>(first_step), start, world->size(), 0);
  if (!o.save_params.empty() && world->rank() == 0) write_params(o.save_params, *model);
  return 0;
}

int run(const Options& o) {
  auto world = lockstep::init_process_group();
  const int world_rank = world->rank(), world_size = world->size();
  const int shards = world_size * o.shards_per_rank;
  if (o.batch % shards != 0)
    throw lockstep::InvalidArgument(fmt::format("--batch {} must divide into {} shards", o.batch, shards));
  if (o.plain && o.shards_per_rank != 1)
    throw lockstep::InvalidArgument("--plain trains one shard per rank (lockstep's DDP): leave out --shards-per-rank");
  torch::set_num_threads(1);
  Net model = make_model();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(0.9));
  const std::uint64_t first_step = resume(o, model, optimizer);
  fashion_mnist::Dataset data(o.data, /*train=*/true, o.subset);
  ShardBatches batches(data, shards, o.batch / shards);

  std::vector<Kill> kills;
  if (first_round()) {
    kills = parse_kills(o.kills, SIGKILL);
    for (const Kill& k : parse_kills(o.freezes, SIGSTOP)) kills.push_back(k);
  }
  const auto kill_at = [&](std::string_view phase, std::uint64_t step) -> const Kill* {
    for (const Kill& k : kills)
      if (k.rank == world_rank && k.step == step && k.phase == phase) return &k;
    return nullptr;
  };
  const auto killed_at = [&](std::string_view phase, std::uint64_t step) { return kill_at(phase, step) != nullptr; };
  const auto kill_here = [&](std::string_view phase, std::uint64_t step) {
    const Kill* k = kill_at(phase, step);
    if (k == nullptr) return;
    std::fprintf(stderr, "rank %d: %s itself at step %llu, %s, at %.6f\n", world_rank,
                 k->signal == SIGSTOP ? "freezing" : "killing", static_cast<unsigned long long>(step),
                 std::string(phase).c_str(), wall_clock_now());
    std::fflush(stderr);
    ::raise(k->signal);
  };
  if (o.plain) return run_plain(o, world, batches, model, optimizer, first_step, kill_here);

  lockstep::torch::ResilientOptions options;
  options.seed = 11;
  options.shards = shards;
  options.first_step = first_step;
  options.window = std::chrono::milliseconds(static_cast<std::int64_t>(o.window * 1000));
  options.bucket_cap_bytes = static_cast<std::size_t>(o.bucket_cap_mb * (1 << 20));
  options.observer = [&](std::string_view phase, std::uint64_t step) {
    if (phase == "re-formed")
      std::printf("re-formed at %.6f\n", wall_clock_now());  // the first collective of the redone step follows
    kill_here(phase, step);
  };
  lockstep::torch::ResilientTrainer trainer(model.ptr(), optimizer, world, options);
  world.reset();  // the trainer holds it, and the groups after it
  if (world_rank == 0) std::printf("the reduction runs in %zu bucket(s)\n", trainer.bucket_count());

  const auto start = std::chrono::steady_clock::now();
  while (trainer.steps_committed() < static_cast<std::uint64_t>(o.steps)) {
    const auto outcome = trainer.step([&](const lockstep::torch::Shard& shard) {
      kill_here("forward", shard.step);
      auto [x, y] = batches.batch(shard.index, shard.step);
      torch::Tensor logits = model->forward(x);
      if (killed_at("backward", shard.step))  // inside backward: at the logits' gradient
        logits.register_hook([&, step = shard.step](torch::Tensor g) {
          kill_here("backward", step);
          return g;
        });
      return torch::nn::functional::cross_entropy(logits, y);
    });
    if (!outcome.lost.empty())
      std::printf("step %llu: lost world rank(s) %s; re-formed in %.3f s; redone %d time(s); this rank now holds "
                  "shards %s of %d\n",
                  static_cast<unsigned long long>(outcome.step), fmt::format("{}", fmt::join(outcome.lost, ",")).c_str(),
                  outcome.recovery_seconds, outcome.redone, fmt::format("{}", fmt::join(trainer.shards(), ",")).c_str(),
                  shards);
    if (trainer.group().rank() == 0 && (outcome.step % 50 == 0 || outcome.step + 1 == static_cast<std::uint64_t>(o.steps)))
      std::printf("step %llu: loss %.4f (shard %d)\n", static_cast<unsigned long long>(outcome.step),
                  outcome.losses.empty() ? 0.0 : outcome.losses.front(), trainer.shards().front());
    const std::uint64_t done = trainer.steps_committed();
    if (!o.checkpoint.empty() && o.checkpoint_every > 0 && done % static_cast<std::uint64_t>(o.checkpoint_every) == 0 &&
        trainer.group().rank() == 0)
      write_checkpoint(o, model, optimizer, done, [&] { kill_here("checkpoint", done - 1); });
    std::fflush(stdout);
  }
  report(world_rank, o.steps - static_cast<int>(first_step), start, trainer.group().size(), trainer.generation());
  if (!o.save_params.empty() && trainer.group().rank() == 0) write_params(o.save_params, *model);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training that survives a rank's death in place (docs/faults.md)"};
  Options o;
  app.add_option("--steps", o.steps, "Steps to commit")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "Global batch (every shard's samples)")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "SGD learning rate (momentum 0.9)");
  app.add_option("--data", o.data, "Fashion-MNIST directory");
  app.add_option("--subset", o.subset, "Use only the first N training images (0: all)");
  app.add_option("--save-params", o.save_params, "Write the final parameters (raw bytes) here, from the first survivor");
  app.add_option("--checkpoint", o.checkpoint, "Resume from this checkpoint if it exists; write it every --checkpoint-every steps");
  app.add_option("--checkpoint-every", o.checkpoint_every, "Steps between checkpoints (0: none)")->check(CLI::NonNegativeNumber);
  app.add_flag("--plain", o.plain, "Train with lockstep's DistributedDataParallel, without recovery (the step time to compare)");
  app.add_option("--kill", o.kills, "RANK:STEP:PHASE: world rank RANK kills itself at step STEP, at PHASE (forward, "
                 "backward, reduce, buffers, barrier, commit, committed, re-form, checkpoint); repeatable (tests)");
  app.add_option("--freeze", o.freezes, "RANK:STEP:PHASE: as --kill, with SIGSTOP (the rank stops answering); "
                 "repeatable (tests)");
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "The reduction's bucket size (MiB), as DDP's bucket_cap_mb")
      ->check(CLI::PositiveNumber);
  app.add_option("--shards-per-rank", o.shards_per_rank,
                 "Logical shards per rank at start: after a loss, the most a survivor computes is ceil(shards / "
                 "survivors), so more shards per rank slow the steps after a loss less")
      ->check(CLI::PositiveNumber);
  app.add_option("--window", o.window, "Seconds the survivors wait for a rank that neither answers nor is known to "
                 "have ended before going on without it")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "in_place_recovery: %s\n", e.what());
    return 1;
  }
}
