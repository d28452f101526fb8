// An optimizer's state as bytes (the archive a checkpoint holds), and back:
// what ZeroRedundancyOptimizer gathers to one rank and what a
// ResilientTrainer sends a replacement. Free functions; as thread-safe as
// the optimizer they read or write.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>

namespace lockstep::torch {

inline std::string serialized(::torch::optim::Optimizer& optimizer) {
  ::torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

inline void load_serialized(::torch::optim::Optimizer& optimizer, const std::string& bytes) {
  ::torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  optimizer.load(archive);
}

}  // namespace lockstep::torch
