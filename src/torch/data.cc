// libtorch sampler adapter and atomic checkpoints; see lockstep/torch/data.h.
#include "lockstep/torch/data.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "lockstep/error.h"

namespace lockstep::torch {

DistributedSampler::DistributedSampler(SamplerOptions options)
    : options_(options), shared_(std::make_shared<Shared>()) {
  lockstep::DistributedSampler check(options_);  // validates the options now
  (void)check;
}

std::size_t DistributedSampler::num_samples() const { return lockstep::DistributedSampler(options_).num_samples(); }

void DistributedSampler::reset(::torch::optional<std::size_t> new_size) {
  if (new_size) options_.dataset_size = *new_size;
  lockstep::DistributedSampler sampler(options_);
  sampler.set_epoch(shared_->epoch);
  indices_ = sampler.indices();
  position_ = 0;
}

::torch::optional<std::vector<std::size_t>> DistributedSampler::next(std::size_t batch_size) {
  if (position_ >= indices_.size()) return ::torch::nullopt;
  const std::size_t end = std::min(indices_.size(), position_ + batch_size);
  std::vector<std::size_t> batch(indices_.begin() + static_cast<std::ptrdiff_t>(position_),
                                 indices_.begin() + static_cast<std::ptrdiff_t>(end));
  position_ = end;
  return batch;
}

void DistributedSampler::save(::torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", ::torch::tensor(static_cast<std::int64_t>(shared_->epoch)), /*is_buffer=*/true);
  archive.write("position", ::torch::tensor(static_cast<std::int64_t>(position_)), /*is_buffer=*/true);
}

void DistributedSampler::load(::torch::serialize::InputArchive& archive) {
  ::torch::Tensor epoch, position;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  shared_->epoch = static_cast<std::uint64_t>(epoch.item<std::int64_t>());
  reset(::torch::nullopt);
  position_ = std::min(indices_.size(), static_cast<std::size_t>(position.item<std::int64_t>()));
}

namespace {

void sync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("checkpoint: cannot open {} to flush it: {}", path, std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(fmt::format("checkpoint: cannot flush {}: {}", path, std::strerror(err)));
}

}  // namespace

void save_checkpoint(const std::string& path, const std::function<void(::torch::serialize::OutputArchive&)>& write) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::create_directories(dir);
  const std::string temp = fmt::format("{}.tmp.{}", path, ::getpid());
  try {
    ::torch::serialize::OutputArchive archive;
    write(archive);
    archive.save_to(temp);
    sync_path(temp, O_RDONLY);
  } catch (...) {
    std::error_code ec;
    fs::remove(temp, ec);
    throw;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove(temp, ec);
    throw Error(fmt::format("checkpoint: cannot rename {} to {}: {}", temp, path, std::strerror(err)));
  }
  sync_path(dir.string(), O_RDONLY | O_DIRECTORY);  // make the rename itself durable
}

bool load_checkpoint(const std::string& path, const std::function<void(::torch::serialize::InputArchive&)>& read) {
  if (!std::filesystem::exists(path)) return false;
  ::torch::serialize::InputArchive archive;
  archive.load_from(path);
  read(archive);
  return true;
}

}  // namespace lockstep::torch
