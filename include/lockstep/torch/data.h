// libtorch adapters for data parallelism: a torch::data sampler that yields
// this rank's shard, and atomic checkpoints.
//
//   lockstep::torch::DistributedSampler sampler({.dataset_size = n, .num_replicas = pg->size(), .rank = pg->rank()});
//   auto loader = torch::data::make_data_loader(dataset, sampler, batch_size);
//   for (int epoch = 0; ...; ++epoch) {
//     sampler.set_epoch(epoch);   // copies share the epoch, so the loader's copy follows
//     for (auto& batch : *loader) ...
//   }
//
// Thread-safety: like torch::data samplers, driven by one loader thread.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/sampler.h"

namespace lockstep::torch {

class DistributedSampler final : public ::torch::data::samplers::Sampler<> {
 public:
  explicit DistributedSampler(SamplerOptions options);

  // Applies to this sampler and every copy of it (the loader keeps one).
  void set_epoch(std::uint64_t epoch) { shared_->epoch = epoch; }
  std::uint64_t epoch() const { return shared_->epoch; }
  std::size_t num_samples() const;

  void reset(::torch::optional<std::size_t> new_size = ::torch::nullopt) override;
  ::torch::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;
  void save(::torch::serialize::OutputArchive& archive) const override;
  void load(::torch::serialize::InputArchive& archive) override;

 private:
  struct Shared {
    std::atomic<std::uint64_t> epoch{0};
  };
  SamplerOptions options_;
  std::shared_ptr<Shared> shared_;
  std::vector<std::size_t> indices_;  // this epoch's shard
  std::size_t position_ = 0;
};

// Writes a checkpoint so that a crash at any moment leaves either the old
// file or the new one, never a torn one: `write` fills an archive, which
// is saved to a temporary file beside `path` (`<path>.tmp.<pid>`), flushed
// to disk, and renamed over `path`; then the directory is flushed. Temporary
// files of earlier saves whose process is gone (killed mid-save) are deleted
// first. Throws Error on I/O failure (the old checkpoint stays).
void save_checkpoint(const std::string& path, const std::function<void(::torch::serialize::OutputArchive&)>& write);

// Reads a checkpoint; returns false if there is none at `path`. Throws Error,
// one sentence naming the file and what to do, if `path` is not a regular
// file, is empty, truncated or corrupt, or lacks what `read` asks for.
bool load_checkpoint(const std::string& path, const std::function<void(::torch::serialize::InputArchive&)>& read);

}  // namespace lockstep::torch
