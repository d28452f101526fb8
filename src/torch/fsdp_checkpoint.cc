// Sharded checkpoints of a fully_shard model: one file per rank, each
// written atomically with the checkpoint format's CRCs (save_checkpoint),
// and every rank told whether every rank succeeded.
#include <fmt/format.h>

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

}  // namespace

void save_sharded_checkpoint(FullyShardModule& model, const std::string& path, ::torch::optim::Optimizer* optimizer) {
  ProcessGroup& pg = model.group();
  std::string outcome;
  try {
    const auto state = model.sharded_state_dict();
    save_checkpoint(rank_file(path, pg), [&](::torch::serialize::OutputArchive& out) {
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
}

bool load_sharded_checkpoint(FullyShardModule& model, const std::string& path, ::torch::optim::Optimizer* optimizer) {
  ProcessGroup& pg = model.group();
  std::string outcome;
  std::map<std::string, Tensor> state;
  try {
    const bool found = load_checkpoint(rank_file(path, pg), [&](::torch::serialize::InputArchive& in) {
      c10::IValue names, world;
      in.read("world_size", world);
      if (world.toInt() != pg.size())
        throw Error(fmt::format("{} was saved by a world of {}, this one is {}: load a full state dict instead",
                                rank_file(path, pg), world.toInt(), pg.size()));
      in.read("names", names);
      std::int64_t k = 0;
      for (const c10::IValue& name : names.toList().vec()) {
        Tensor t;
        in.read(fmt::format("t{}", k++), t);
        state[name.toStringRef()] = t;
      }
      if (optimizer) {
        ::torch::serialize::InputArchive state_of_optimizer;
        in.read("optimizer", state_of_optimizer);
        optimizer->load(state_of_optimizer);
      }
    });
    if (found) model.load_sharded_state_dict(state);
    else outcome = "none";
  } catch (const std::exception& e) {
    outcome = e.what();
  }
  const auto all = outcomes(pg, outcome);
  throw_first_failure(pg, all, "load");
  const auto missing = std::count(all.begin(), all.end(), std::string("none"));
  if (missing == static_cast<long>(all.size())) return false;
  if (missing > 0)
    throw Error(fmt::format("{} of {} ranks have no shard file at {}.rank<r>-of-{}: the checkpoint is incomplete",
                            missing, all.size(), path, pg.size()));
  return true;
}

}  // namespace lockstep::torch
