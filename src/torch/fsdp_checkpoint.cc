// Sharded checkpoints of a fully_shard model: one file per rank, each
// written atomically with the checkpoint format's CRCs (save_checkpoint),
// and every rank told whether every rank succeeded. Each rank replaces its
// own file, so a job stopped between two ranks' writes would leave files
// of two steps: each rank keeps its previous file until every rank has
// written the new one, and a load takes the newest step every rank holds.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "lockstep/error.h"
#include "lockstep/object_collectives.h"
#include "lockstep/torch/data.h"
#include "lockstep/torch/fully_shard.h"

namespace lockstep::torch {
namespace {

using ::torch::Tensor;

std::string rank_file(const std::string& path, const ProcessGroup& pg) {
  return fmt::format("{}.rank{}-of-{}", path, pg.rank(), pg.size());
}

std::string previous_of(const std::string& file) { return file + ".previous"; }

// What each rank's part of a collective save or load came to: "" (done),
// "none" (no file) or the reason it failed.
std::vector<std::string> outcomes(ProcessGroup& pg, const std::string& mine) {
  std::vector<std::string> all;
  for (const auto& bytes : all_gather_object(pg, to_bytes(mine))) all.push_back(to_string(bytes));
  return all;
}

void throw_first_failure(ProcessGroup& pg, const std::vector<std::string>& all, const char* what) {
  for (int r = 0; r < pg.size(); ++r) {
    const auto& outcome = all[static_cast<std::size_t>(r)];
    if (!outcome.empty() && outcome != "none")
      throw Error(r == pg.rank() ? outcome : fmt::format("rank {} could not {} its shard: {}", r, what, outcome));
  }
}

// A rank's shard file read once: its steps (0 from a file written without
// them; -1 where there is no file) and, when asked, its tensors and
// optimizer state, held until the step to load is chosen.
struct ShardFile {
  std::int64_t steps = -1;
  std::map<std::string, Tensor> state;
  ::torch::serialize::InputArchive optimizer;
};

ShardFile read_shard_file(const std::string& file, const ProcessGroup& pg, bool whole, bool with_optimizer) {
  ShardFile read;
  load_checkpoint(file, [&](::torch::serialize::InputArchive& in) {
    c10::IValue world, saved;
    in.read("world_size", world);
    if (world.toInt() != pg.size())
      throw Error(fmt::format("{} was saved by a world of {}, this one is {}: load a full state dict instead", file,
                              world.toInt(), pg.size()));
    read.steps = in.try_read("steps", saved) ? saved.toInt() : 0;
    if (!whole) return;
    c10::IValue names;
    in.read("names", names);
    std::int64_t k = 0;
    for (const c10::IValue& name : names.toList().vec()) {
      Tensor t;
      in.read(fmt::format("t{}", k++), t);
      read.state[name.toStringRef()] = t;
    }
    if (with_optimizer) in.read("optimizer", read.optimizer);
  });
  return read;
}

// The newest step every rank holds a file of, or -1.
std::int64_t newest_common_step(const std::vector<std::int64_t>& held, int ranks) {
  std::int64_t newest = -1;
  for (std::int64_t candidate : held) {
    if (candidate <= newest) continue;
    bool everywhere = true;
    for (std::size_t r = 0; r < static_cast<std::size_t>(ranks) && everywhere; ++r)
      everywhere = held[2 * r] == candidate || held[2 * r + 1] == candidate;
    if (everywhere) newest = candidate;
  }
  return newest;
}

}  // namespace

void save_sharded_checkpoint(FullyShardModule& model, const std::string& path, ::torch::optim::Optimizer* optimizer,
                             std::uint64_t steps) {
  namespace fs = std::filesystem;
  ProcessGroup& pg = model.group();
  const std::string file = rank_file(path, pg);
  std::string outcome;
  try {
    const auto state = model.sharded_state_dict();
    if (fs::exists(file)) fs::rename(file, previous_of(file));  // kept until every rank has written
    save_checkpoint(file, [&](::torch::serialize::OutputArchive& out) {
      // Names go in a list beside numbered tensors: archive keys are
      // attribute names, which a dotted parameter name is not.
      c10::List<std::string> names;
      std::int64_t k = 0;
      for (const auto& [name, tensor] : state) {
        names.push_back(name);
        out.write(fmt::format("t{}", k++), tensor);
      }
      out.write("names", c10::IValue(names));
      out.write("world_size", c10::IValue(static_cast<std::int64_t>(pg.size())));
      out.write("steps", c10::IValue(static_cast<std::int64_t>(steps)));
      if (optimizer) {
        ::torch::serialize::OutputArchive state_of_optimizer;
        optimizer->save(state_of_optimizer);
        out.write("optimizer", state_of_optimizer);
      }
    });
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  throw_first_failure(pg, outcomes(pg, outcome), "save");
  std::error_code ignored;  // every rank holds the new step: the previous one is no longer needed
  fs::remove(previous_of(file), ignored);
}

bool load_sharded_checkpoint(FullyShardModule& model, const std::string& path, ::torch::optim::Optimizer* optimizer,
                             std::uint64_t* steps) {
  ProcessGroup& pg = model.group();
  const std::string file = rank_file(path, pg);
  std::string outcome;
  // This rank's file read whole (the one loaded but after a failed save);
  // its previous one for its steps only.
  ShardFile current;
  std::int64_t mine[2] = {-1, -1};
  try {
    current = read_shard_file(file, pg, /*whole=*/true, optimizer != nullptr);
    mine[0] = current.steps;
    mine[1] = read_shard_file(previous_of(file), pg, /*whole=*/false, false).steps;
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  throw_first_failure(pg, outcomes(pg, outcome), "load");
  std::vector<std::int64_t> held(2 * static_cast<std::size_t>(pg.size()));
  pg.allgather(ConstBuffer{mine, 2, DType::i64}, Buffer{held.data(), held.size(), DType::i64})->wait();

  std::vector<int> without;
  std::vector<std::string> held_by;
  for (int r = 0; r < pg.size(); ++r) {
    const std::int64_t newer = held[2 * static_cast<std::size_t>(r)], older = held[2 * static_cast<std::size_t>(r) + 1];
    if (newer < 0 && older < 0) without.push_back(r);
    held_by.push_back(older < 0 ? fmt::format("rank {}: {}", r, newer)
                                : fmt::format("rank {}: {} and {}", r, newer, older));
  }
  if (static_cast<int>(without.size()) == pg.size()) return false;
  if (!without.empty())
    throw Error(fmt::format("{} of {} ranks (ranks {}) have no shard file at {}.rank<r>-of-{}: the checkpoint is "
                            "incomplete",
                            without.size(), pg.size(), fmt::join(without, ", "), path, pg.size()));
  const std::int64_t chosen = newest_common_step(held, pg.size());
  if (chosen < 0)
    throw Error(fmt::format("{}.rank<r>-of-{}: no step is saved by every rank (steps held: {}): the checkpoint is torn "
                            "(a job stopped while writing it, twice); remove it to start afresh or restore a whole "
                            "one",
                            path, pg.size(), fmt::join(held_by, "; ")));

  outcome.clear();
  try {
    ShardFile chosen_file = mine[0] == chosen
                                ? std::move(current)
                                : read_shard_file(previous_of(file), pg, /*whole=*/true, optimizer != nullptr);
    model.load_sharded_state_dict(chosen_file.state);
    if (optimizer) optimizer->load(chosen_file.optimizer);
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  throw_first_failure(pg, outcomes(pg, outcome), "load");
  if (steps) *steps = static_cast<std::uint64_t>(chosen);
  return true;
}

}  // namespace lockstep::torch
