// libtorch sampler adapter and atomic checkpoints; see lockstep/torch/data.h.
#include "lockstep/torch/data.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include <fmt/format.h>

#include "common/file.h"
#include "lockstep/error.h"
#include "zip_integrity.h"

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

// Deletes the temporary files of saves that were killed before their
// rename (`<name>.tmp.<pid>` whose process is gone), so they do not pile up
// beside the checkpoint. A live process's file is left alone: two writers
// of one path must not delete each other's work in progress.
void remove_stale_temporaries(const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp.";  // see temporary_path (common/file.h)
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string suffix = name.substr(prefix.size());
    if (suffix.empty() || suffix.find_first_not_of("0123456789") != std::string::npos || suffix.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(suffix));
    if (pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH)) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

// The first line of a libtorch error: its message without the C++ stack
// trace that follows.
std::string first_line(const std::exception& e) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = torch_error ? torch_error->what_without_backtrace() : e.what();
  text = text.substr(0, text.find('\n'));
  return text;
}

}  // namespace

void save_checkpoint(const std::string& path, const std::function<void(::torch::serialize::OutputArchive&)>& write) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  fs::create_directories(dir);
  remove_stale_temporaries(target);
  ::torch::serialize::OutputArchive archive;
  write(archive);
  // Through write_file_atomically: a full disk or a crash mid-save leaves
  // the previous checkpoint whole and no partial file (tests/faults).
  write_file_atomically(
      path,
      [&](const ByteWriter& out) {
        archive.save_to([&](const void* data, std::size_t len) {
          out(data, len);
          return len;
        });
      },
      FileSync::to_disk);
}

bool load_checkpoint(const std::string& path, const std::function<void(::torch::serialize::InputArchive&)>& read) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw Error(fmt::format("cannot look at checkpoint {}: {}; check the permissions of its directory", path,
                            ec.message()));
  if (!fs::exists(status)) return false;
  constexpr char kStartOver[] = "delete it or move it away to start over";
  if (!fs::is_regular_file(status))
    throw Error(fmt::format("checkpoint {} is not a file (a directory or a device is in its place); {}, or choose "
                            "another checkpoint path",
                            path, kStartOver));
  if (fs::file_size(path, ec) == 0)
    throw Error(fmt::format("checkpoint {} is empty (a save was cut short, or something else created it); {}", path,
                            kStartOver));
  // libtorch's reader does not check the archive's checksums: a file whose
  // tensor bytes changed on disk would load, and training resume from them.
  const std::string bytes = read_whole_file(path);
  if (const std::string problem = zip_integrity_problem(std::as_bytes(std::span(bytes))); !problem.empty())
    throw Error(fmt::format("checkpoint {} is damaged: {}; restore it from a copy, or {}", path, problem, kStartOver));
  // libtorch's errors carry a C++ stack trace; the user needs one sentence.
  ::torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint {} cannot be read ({}): it is truncated, corrupt or not a checkpoint; {}", path,
                            first_line(e), kStartOver));
  }
  try {
    read(archive);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(fmt::format("checkpoint {} does not hold what this program saves ({}): it was written by another "
                            "program or model; {}",
                            path, first_line(e), kStartOver));
  }
  return true;
}

}  // namespace lockstep::torch
