// Training that survives a rank's death in place (docs/faults.md): an MLP
// on Fashion-MNIST through lockstep::torch::ResilientTrainer. Kill a rank
// and the others go on in the same processes, share out its shards, redo
// the step it interrupted, and end with the parameters a run without the
// failure ends with, bit for bit:
//   build/lockstep run --nproc-per-node 4 --on-rank-failure continue -- \
//     build/examples/in_place_recovery --steps 200 --save-params /tmp/params.bin
//
// With --max-replacements N the launcher also starts the dead rank again:
// the replacement joins at a step boundary, is fed by its peers, and the
// group grows back to 4 (--kill-replacement kills a replacement in turn,
// --step-ms slows the steps so that there is time to see it):
//   build/lockstep run --nproc-per-node 4 --on-rank-failure continue --max-replacements 2 -- \
//     build/examples/in_place_recovery --steps 600 --step-ms 15 --kill 1:10:reduce \
//     --kill-replacement 1:1:20:barrier
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
// --zero shards the optimizer's state (ZeRO-1) with each partition kept by
// its owner and by the next rank (ResilientOptions::shard_optimizer_state;
// --no-backup keeps it on the owner only: a death then ends in the
// restart); the checkpoint's optimizer state is consolidated first.
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
// launcher then kills it. --kill-each-round R:K:N kills rank R K steps
// into each of the launcher's first N rounds: the steady schedule of
// bench/replacements.py under --on-rank-failure restart. --drift R nudges
// world rank R's parameters as a replacement is admitted: the feed's
// comparison must name it.
#include <lockstep/error.h>
#include <lockstep/process_group.h>
#include <lockstep/torch/data.h>
#include <lockstep/torch/ddp.h>
#include <lockstep/torch/resilient.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>
#include <string>

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
using fashion_mnist::ShardBatches;

struct Options {
  int steps = 100;
  int batch = 64;  // global, over all shards
  double lr = 0.05;
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::size_t subset = 6000;
  std::string save_params;
  std::string save_params_of_each;  // every rank writes PATH.<world rank>
  std::string checkpoint;
  int checkpoint_every = 0;
  bool plain = false;
  bool zero = false;       // ZeRO-1 in the trainer
  bool no_backup = false;  // ... without the backup of each partition
  std::vector<std::string> kills;    // "rank:step:phase"
  std::vector<std::string> freezes;  // the same, SIGSTOP instead of SIGKILL
  double window = 10;                // seconds the survivors wait for a rank that does not answer
  double bucket_cap_mb = 25;         // the reduction's buckets, as DDP's bucket_cap_mb
  int shards_per_rank = 1;           // logical shards per rank at start
  std::vector<std::string> replacement_kills;  // "rank:incarnation:steps:phase"
  std::string kill_each_round;       // "rank:steps:rounds": a steady schedule under the restart
  double step_ms = 0;                // a pause after each step (a slower model, for demonstrations)
  double shard_ms = 0;               // a pause in each shard's computation (a step that takes longer)
  int hidden = 128;                  // the MLP's hidden width (a bigger model: more state to feed a replacement)
  int drift = -1;                    // this world rank's parameters drift as a replacement is admitted
  std::string step_times;            // world rank 0 writes each committed step's time and group size here
};

struct Kill {
  int rank = -1;
  std::uint64_t step = 0;
  std::string phase;
  int signal = SIGKILL;  // SIGSTOP: --freeze
  // Phases that come only when a replacement joins (admit, feed, fed): the
  // first at or after `step`.
  bool from_step = false;
};

std::vector<Kill> parse_kills(const std::vector<std::string>& specs, int signal) {
  static const std::set<std::string> phases = {"forward", "backward",  "reduce",  "buffers",    "barrier",
                                               "commit",  "committed", "re-form", "checkpoint", "admit",
                                               "feed",    "fed"};
  std::vector<Kill> out;
  for (const std::string& spec : specs) {
    const auto a = spec.find(':'), b = spec.rfind(':');
    Kill k;
    if (a == std::string::npos || a == b) throw lockstep::InvalidArgument("--kill " + spec + ": use RANK:STEP:PHASE");
    k.rank = std::stoi(spec.substr(0, a));
    k.step = std::stoull(spec.substr(a + 1, b - a - 1));
    k.phase = spec.substr(b + 1);
    k.signal = signal;
    k.from_step = k.phase == "admit" || k.phase == "feed" || k.phase == "fed";
    const bool bucket = k.phase.rfind("bucket", 0) == 0 && k.phase.size() > 6 &&
                        k.phase.find_first_not_of("0123456789", 6) == std::string::npos;
    if (!phases.count(k.phase) && !bucket)
      throw lockstep::InvalidArgument("--kill " + spec + ": the phase is one of forward, backward, reduce, buffers, "
                                      "barrier, commit, committed, re-form, checkpoint, admit, feed, fed, or "
                                      "bucketK (before the reduction's bucket K, K >= 1)");
    out.push_back(k);
  }
  return out;
}

using examples::ReplacementKill;

std::vector<ReplacementKill> parse_replacement_kills(const std::vector<std::string>& specs) {
  return examples::parse_replacement_kills(
      specs, [](const std::string& phase) { parse_kills({"0:0:" + phase}, SIGKILL); });  // checks the phase
}

void write_params(const std::string& path, nn::Module& model) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& p : model.parameters()) {
    const torch::Tensor c = p.detach().contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
}

using Net = nn::Sequential;

Net make_model(int hidden) {
  torch::manual_seed(1);
  return nn::Sequential(nn::Flatten(), nn::Linear(28 * 28, hidden), nn::ReLU(), nn::Dropout(0.1),
                        nn::Linear(hidden, 10));
}

// SGD with momentum keeps one tensor per parameter, its size.
std::int64_t optimizer_state_bytes_unsharded(Net& model) {
  std::int64_t bytes = 0;
  for (const auto& p : model->parameters()) bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  return bytes;
}

// --kill-each-round R:K:N: in each of the launcher's first N rounds, world
// rank R kills itself K steps after the round's first step, before the
// reduction: a death every K steps under the restart, as a steady kill
// schedule under the in-place mode (bench/replacements.py).
std::optional<Kill> round_kill(const std::string& spec, std::uint64_t first_step) {
  if (spec.empty()) return std::nullopt;
  Kill k;
  std::uint64_t steps = 0;
  int rounds = 0;
  char c1 = 0, c2 = 0;
  std::istringstream in(spec);
  if (!(in >> k.rank >> c1 >> steps >> c2 >> rounds) || c1 != ':' || c2 != ':' || steps == 0)
    throw lockstep::InvalidArgument("--kill-each-round " + spec + ": use RANK:STEPS:ROUNDS (STEPS >= 1)");
  if (launcher_round() >= rounds) return std::nullopt;
  k.step = first_step + steps;
  k.phase = "reduce";
  return k;
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
  // A replacement (lockstep run --max-replacements) joined a running group:
  // its rank there need not be its world rank, nor its size the world's.
  const int world_rank = world->world_ranks()[static_cast<std::size_t>(world->rank())];
  const int world_size = world->job_size();
  const int shards = world_size * o.shards_per_rank;
  if (o.batch % shards != 0)
    throw lockstep::InvalidArgument(fmt::format("--batch {} must divide into {} shards", o.batch, shards));
  if (o.plain && o.shards_per_rank != 1)
    throw lockstep::InvalidArgument("--plain trains one shard per rank (lockstep's DDP): leave out --shards-per-rank");
  torch::set_num_threads(1);
  Net model = make_model(o.hidden);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(0.9));
  const std::uint64_t first_step = resume(o, model, optimizer);
  fashion_mnist::Dataset data(o.data, /*train=*/true, o.subset);
  ShardBatches batches(data, shards, o.batch / shards);

  std::vector<Kill> kills;
  if (first_round() && !world->joined()) {
    kills = parse_kills(o.kills, SIGKILL);
    for (const Kill& k : parse_kills(o.freezes, SIGSTOP)) kills.push_back(k);
  }
  if (auto k = round_kill(o.kill_each_round, first_step); k && !world->joined()) kills.push_back(*k);
  const std::vector<ReplacementKill> replacement_kills =
      world->joined() ? parse_replacement_kills(o.replacement_kills) : std::vector<ReplacementKill>{};
  const auto kill_at = [&](std::string_view phase, std::uint64_t step) -> const Kill* {
    for (const Kill& k : kills)
      if (k.rank == world_rank && (k.from_step ? step >= k.step : k.step == step) && k.phase == phase) return &k;
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
  options.shard_optimizer_state = o.zero;
  options.optimizer_state_backup = !o.no_backup;
  double feed_started = 0;
  options.observer = [&](std::string_view phase, std::uint64_t step) {
    if (phase == "re-formed")
      std::printf("re-formed at %.6f\n", wall_clock_now());  // the first collective of the redone step follows
    if (phase == "admit" && world_rank == o.drift) {
      // A replica gone silently wrong: the feed's digests must name it.
      torch::NoGradGuard no_grad;
      model->parameters().front().view(-1)[0].add_(1e-3);
    }
    if (phase == "feed") feed_started = wall_clock_now();
    if (phase == "fed")
      std::printf("fed a replacement: %.3f s from the first broadcast to every digest compared\n",
                  wall_clock_now() - feed_started);
    kill_here(phase, step);
  };
  const bool replacement = world->joined();
  // A replacement's kill while it is fed (phase feed or fed) comes before
  // it knows its step.
  for (const ReplacementKill& k : replacement_kills)
    if (k.rank == world_rank && k.incarnation == incarnation() && (k.phase == "feed" || k.phase == "fed"))
      kills.push_back(Kill{k.rank, 0, k.phase, SIGKILL, true});
  lockstep::torch::ResilientTrainer trainer(model.ptr(), optimizer, world, options);
  world.reset();  // the trainer holds it, and the groups after it
  const std::uint64_t joined_at = trainer.steps_committed();
  if (replacement) {
    std::printf("world rank %d (replacement %d): joined at step %llu, fed by its peers; holds shards %s of %d; "
                "training at %.6f (process started at %.2f)\n",
                world_rank, incarnation(), static_cast<unsigned long long>(joined_at),
                fmt::format("{}", fmt::join(trainer.shards(), ",")).c_str(), trainer.shard_count(), wall_clock_now(),
                process_started_at());
    // Kills K steps after it joined: --kill-replacement.
    for (const ReplacementKill& k : replacement_kills)
      if (k.rank == world_rank && k.incarnation == incarnation() && k.phase != "feed" && k.phase != "fed")
        kills.push_back(Kill{k.rank, joined_at + k.after, k.phase, SIGKILL, k.phase == "admit"});
  }
  if (world_rank == 0 && !replacement) std::printf("the reduction runs in %zu bucket(s)\n", trainer.bucket_count());

  // --step-times: kept in memory, written at the end, so that recording
  // costs no step a write.
  struct StepTime {
    std::uint64_t step;
    double at;
    int ranks;
  };
  std::vector<StepTime> step_times;
  const bool record_steps = !o.step_times.empty() && world_rank == 0 && !replacement;
  if (record_steps) step_times.reserve(static_cast<std::size_t>(o.steps));
  const auto start = std::chrono::steady_clock::now();
  while (trainer.steps_committed() < static_cast<std::uint64_t>(o.steps)) {
    const auto outcome = trainer.step([&](const lockstep::torch::Shard& shard) {
      kill_here("forward", shard.step);
      if (o.shard_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.shard_ms));
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
    if (!outcome.joined.empty())
      std::printf("step %llu: world rank(s) %s joined as replacements; %d ranks; this rank now holds shards %s\n",
                  static_cast<unsigned long long>(outcome.step),
                  fmt::format("{}", fmt::join(outcome.joined, ",")).c_str(), trainer.group().size(),
                  fmt::format("{}", fmt::join(trainer.shards(), ",")).c_str());
    if (record_steps) step_times.push_back({outcome.step, wall_clock_now(), trainer.group().size()});
    if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.step_ms));
    if (trainer.group().rank() == 0 && (outcome.step % 50 == 0 || outcome.step + 1 == static_cast<std::uint64_t>(o.steps)))
      std::printf("step %llu: loss %.4f (shard %d)\n", static_cast<unsigned long long>(outcome.step),
                  outcome.losses.empty() ? 0.0 : outcome.losses.front(), trainer.shards().front());
    const std::uint64_t done = trainer.steps_committed();
    if (!o.checkpoint.empty() && o.checkpoint_every > 0 && done % static_cast<std::uint64_t>(o.checkpoint_every) == 0) {
      trainer.consolidate_optimizer_state();  // sharded: the whole state to the first rank
      if (trainer.group().rank() == 0)
        write_checkpoint(o, model, optimizer, done, [&] { kill_here("checkpoint", done - 1); });
    }
    std::fflush(stdout);
  }
  report(world_rank, o.steps - static_cast<int>(replacement ? joined_at : first_step), start, trainer.group().size(),
         trainer.generation());
  if (o.zero)
    std::printf("world rank %d: optimizer state %zu bytes of %zu\n", world_rank, trainer.optimizer_state_bytes(),
                static_cast<std::size_t>(optimizer_state_bytes_unsharded(model)));
  if (!o.save_params.empty() && trainer.group().rank() == 0) write_params(o.save_params, *model);
  if (!o.save_params_of_each.empty())
    write_params(fmt::format("{}.{}", o.save_params_of_each, world_rank), *model);
  if (record_steps) {
    std::ofstream out(o.step_times);
    for (const StepTime& t : step_times) out << fmt::format("{} {:.6f} {}\n", t.step, t.at, t.ranks);
    if (!out) throw lockstep::Error("--step-times: cannot write " + o.step_times);
  }
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
  app.add_option("--save-params-of-each-rank", o.save_params_of_each,
                 "Every rank writes its final parameters to PATH.<world rank> (a replacement's must be its peers')");
  app.add_option("--checkpoint", o.checkpoint, "Resume from this checkpoint if it exists; write it every --checkpoint-every steps");
  app.add_option("--checkpoint-every", o.checkpoint_every, "Steps between checkpoints (0: none)")->check(CLI::NonNegativeNumber);
  app.add_flag("--zero", o.zero, "Shard the optimizer's state (ZeRO-1), each partition kept by its owner and the "
               "next rank, so that a death loses none of it");
  app.add_flag("--no-backup", o.no_backup, "With --zero: each partition on its owner only (a death ends in the "
               "restart from the checkpoint)");
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
  app.add_option("--kill-replacement", o.replacement_kills,
                 "RANK:INCARNATION:STEPS:PHASE: replacement INCARNATION (1, 2, ...) of world rank RANK kills itself "
                 "STEPS steps after it joined, at PHASE (lockstep run --max-replacements; repeatable; tests)");
  app.add_option("--kill-each-round", o.kill_each_round,
                 "RANK:STEPS:ROUNDS: in each of the launcher's first ROUNDS rounds, world rank RANK kills itself "
                 "STEPS steps after the round's first step (a steady kill schedule under --on-rank-failure restart)");
  app.add_option("--hidden", o.hidden, "The MLP's hidden width (a bigger model)")->check(CLI::PositiveNumber);
  app.add_option("--drift", o.drift,
                 "RANK: world rank RANK nudges one of its parameters as each replacement is admitted, as a replica "
                 "gone silently wrong (the feed's comparison must stop the job, naming it)");
  app.add_option("--step-ms", o.step_ms, "Pause this long after each step (a slower model, for demonstrations)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--shard-ms", o.shard_ms,
                 "Pause this long in each shard's computation: a step that takes longer, as a bigger model's (a rank "
                 "holding two shards after a death takes twice as long)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-times", o.step_times,
                 "World rank 0 writes each committed step's wall-clock time and its group's size here, one line a "
                 "step (where a run with deaths lost its time: bench/replacements.py --trace-only)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const lockstep::JobFinished& e) {
    std::printf("in_place_recovery: %s\n", e.what());  // a replacement that came too late: nothing to do
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "in_place_recovery: %s\n", e.what());
    return 1;
  }
}
