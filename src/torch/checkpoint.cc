// Checkpoints saved by rank 0 and loaded by rank 0 then broadcast. Rank 0
// tells the others the outcome with one broadcast of a status (the byte
// count, or a code and a reason), so a failure there is an error everywhere
// rather than a rank waiting for bytes that never come.
#include "lockstep/torch/checkpoint.h"

#include <fmt/format.h>

#include <sstream>

#include "common/file.h"
#include "lockstep/error.h"
#include "lockstep/torch/data.h"

namespace lockstep::torch {
namespace {

constexpr std::int64_t kNoFile = -1;
constexpr std::int64_t kFailed = -2;

void broadcast_int(ProcessGroup& pg, std::int64_t& value) {
  pg.broadcast(Buffer{&value, 1, DType::i64}, 0)->wait();
}

void broadcast_bytes(ProcessGroup& pg, std::string& bytes) {
  if (!bytes.empty()) pg.broadcast(Buffer{bytes.data(), bytes.size(), DType::u8}, 0)->wait();
}

// Rank 0 sends `status` (>= 0, or kFailed followed by the reason's length
// and text); other ranks receive it. Returns the status.
std::int64_t share_status(ProcessGroup& pg, std::int64_t status, std::string& reason) {
  broadcast_int(pg, status);
  if (status == kFailed) {
    std::int64_t length = static_cast<std::int64_t>(reason.size());
    broadcast_int(pg, length);
    reason.resize(static_cast<std::size_t>(length));
    broadcast_bytes(pg, reason);
  }
  return status;
}

}  // namespace

void save_checkpoint_on_rank0(ProcessGroup& pg, const std::string& path,
                              const std::function<void(::torch::serialize::OutputArchive&)>& write) {
  std::string reason;
  std::int64_t status = 0;
  if (pg.rank() == 0) {
    try {
      save_checkpoint(path, write);
    } catch (const std::exception& e) {
      status = kFailed;
      reason = e.what();
    }
  }
  if (share_status(pg, status, reason) == kFailed)
    throw Error(pg.rank() == 0 ? reason : fmt::format("rank 0 could not save the checkpoint: {}", reason));
}

bool load_checkpoint_broadcast(ProcessGroup& pg, const std::string& path,
                               const std::function<void(::torch::serialize::InputArchive&)>& read) {
  std::string bytes, reason;
  std::int64_t status = kNoFile;
  if (pg.rank() == 0) {
    try {
      // load_checkpoint's checks (a file, not empty, a readable archive).
      if (load_checkpoint(path, [](::torch::serialize::InputArchive&) {})) {
        bytes = read_whole_file(path);
        status = static_cast<std::int64_t>(bytes.size());
      }
    } catch (const std::exception& e) {
      status = kFailed;
      reason = e.what();
    }
  }
  status = share_status(pg, status, reason);
  if (status == kFailed)
    throw Error(pg.rank() == 0 ? reason : fmt::format("rank 0 could not load the checkpoint: {}", reason));
  if (status == kNoFile) return false;
  bytes.resize(static_cast<std::size_t>(status));
  broadcast_bytes(pg, bytes);
  ::torch::serialize::InputArchive archive;
  archive.load_from(bytes.data(), bytes.size());
  try {
    read(archive);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));  // libtorch's errors carry a stack trace
    throw Error(fmt::format("checkpoint {} does not hold what this program saves ({}): it was written by another "
                            "program or model; delete it or move it away to start over",
                            path, what));
  }
  return true;
}

}  // namespace lockstep::torch
