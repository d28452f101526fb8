// See communicator.h.
#include "comm/nccl/communicator.h"

#include <fmt/format.h>

#include <cstring>
#include <thread>

#include "comm/nccl/types.h"

namespace lockstep::nccl {
namespace {

// How often a wait looks at the device and at NCCL: short against a
// collective, long enough not to take a core from the caller's threads.
constexpr auto kPollInterval = std::chrono::microseconds(20);

// The unique id travels hex-encoded: stores take text.
std::string to_hex(const ncclUniqueId& id) {
  std::string out;
  out.reserve(2 * sizeof(id.internal));
  for (char c : id.internal) out += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return out;
}

ncclUniqueId from_hex(const std::string& text, int rank) {
  ncclUniqueId id{};
  if (text.size() != 2 * sizeof(id.internal))
    throw Error(fmt::format("rank {}: the NCCL unique id in the store has {} characters, not {}; another program "
                            "may share this group's store keys",
                            rank, text.size(), 2 * sizeof(id.internal)));
  for (std::size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  return id;
}

ncclUniqueId exchange_unique_id(const BackendContext& ctx) {
  if (ctx.rank == 0) {
    ncclUniqueId id{};
    check(ncclGetUniqueId(&id), nullptr, fmt::format("rank 0/{}: making the NCCL unique id", ctx.size));
    ctx.store->set(kUniqueIdKey, to_hex(id));
    return id;
  }
  ctx.store->wait({kUniqueIdKey}, ctx.connect_timeout);
  return from_hex(ctx.store->get(kUniqueIdKey), ctx.rank);
}

bool mentions(const char* text, const char* what) { return text != nullptr && std::strstr(text, what) != nullptr; }

}  // namespace

Communicator::Communicator(const BackendContext& ctx, int device)
    : rank_(ctx.rank), size_(ctx.size), device_(device) {
  const ncclUniqueId id = exchange_unique_id(ctx);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll (see the header)
  ncclResult_t state = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  const Deadline deadline = Deadline::after(ctx.connect_timeout);
  while (state == ncclInProgress && comm_ != nullptr) {
    if (deadline.expired()) {
      abort("its creation timed out");
      throw TimeoutError(fmt::format("{}: the NCCL communicator was not formed within {:.1f} s: some rank did not "
                                     "join, or NCCL cannot connect the ranks; check that every rank started with "
                                     "backend nccl, NCCL_SOCKET_IFNAME / NCCL_IB_HCA, and NCCL_DEBUG=WARN output, "
                                     "or raise LOCKSTEP_CONNECT_TIMEOUT",
                                     who(), static_cast<double>(ctx.connect_timeout.count()) / 1000.0));
    }
    std::this_thread::sleep_for(kPollInterval);
    state = async_state();
  }
  if (state == ncclSuccess) return;
  const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
  const std::string detail = last != nullptr && last[0] != '\0' ? last : ncclGetErrorString(state);
  abort("its creation failed");
  if (state == ncclInvalidUsage && mentions(detail.c_str(), "Duplicate GPU"))
    throw ConfigError(fmt::format("{}: NCCL refuses two ranks on one GPU ({}): the nccl backend needs one GPU per "
                                  "rank; give each rank its own device (CUDA_VISIBLE_DEVICES, LOCAL_RANK), or use "
                                  "backend shm or tcp for several ranks that share a GPU",
                                  who(), detail));
  if (state == ncclInvalidUsage)
    throw ConfigError(fmt::format("{}: NCCL refused to form the communicator ({}); the nccl backend needs one GPU "
                                  "per rank and the same NCCL version on every rank",
                                  who(), detail));
  check(state, nullptr, fmt::format("{}: forming the NCCL communicator ({})", who(), detail));
}

Communicator::~Communicator() { abort("the group ended without a shutdown"); }

ncclComm_t Communicator::get(const OpContext& op) const {
  if (comm_ == nullptr)
    throw Error(fmt::format("{}: {} cannot run: this group's NCCL communicator was aborted because {}; create a new "
                            "group",
                            who(), op.description(), aborted_because_));
  return comm_;
}

ncclResult_t Communicator::async_state() const {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t read = ncclCommGetAsyncError(comm_, &state);
  return read == ncclSuccess ? state : read;
}

void Communicator::settle(ncclResult_t result, const OpContext& op, std::string_view what) {
  while (result == ncclInProgress) {
    if (op.cancelled() || op.deadline.expired()) fail_waiting(op, what);
    std::this_thread::sleep_for(kPollInterval);
    result = async_state();
  }
  if (result != ncclSuccess) fail(result, op, what);
}

void Communicator::wait(const cuda::Event& done, const OpContext& op, std::string_view what) {
  while (!poll(done, op, what)) std::this_thread::sleep_for(kPollInterval);
}

bool Communicator::poll(const cuda::Event& done, const OpContext& op, std::string_view what) {
  const ncclResult_t state = async_state();
  if (state != ncclSuccess && state != ncclInProgress) fail(state, op, what);
  bool finished = false;
  try {
    finished = done.query();
  } catch (const Error& e) {
    abort(fmt::format("the device failed during {}", op.description()));
    throw Error(fmt::format("{}: {} {}: {}", who(), op.description(), what, e.what()));
  }
  if (finished) return true;
  if (op.cancelled() || op.deadline.expired()) fail_waiting(op, what);
  return false;
}

void Communicator::fail(ncclResult_t state, const OpContext& op, std::string_view what) {
  const char* last = comm_ != nullptr ? ncclGetLastError(comm_) : nullptr;
  const std::string detail = last != nullptr && last[0] != '\0' ? last : "no further detail";
  if (state == ncclInvalidArgument)  // NCCL refused the call; the communicator is still sound
    throw InvalidArgument(fmt::format("{}: {} {}: NCCL refused the arguments ({})", who(), op.description(), what,
                                      detail));
  abort(fmt::format("{} failed", op.description()));
  const std::string message =
      fmt::format("{}: {} {}: NCCL error {} ({}); a peer may have died or lost its connection: look at the other "
                  "ranks' errors, and NCCL_DEBUG=WARN output",
                  who(), op.description(), what, ncclGetErrorString(state), detail);
  if (state == ncclRemoteError || state == ncclSystemError) throw PeerError(message);
  throw Error(message);
}

void Communicator::fail_waiting(const OpContext& op, std::string_view what) {
  if (op.cancelled()) {
    abort(fmt::format("{} was cancelled", op.description()));
    throw OperationCancelled(fmt::format("{}: {} was cancelled {}", who(), op.description(), what));
  }
  abort(fmt::format("{} timed out", op.description()));
  throw TimeoutError(fmt::format("{}: {} timed out after {:.1f} s {}: some rank did not enter the collective, or its "
                                 "device is stuck; look at the other ranks' errors (a rank that failed or issued a "
                                 "different collective), or raise LOCKSTEP_TIMEOUT if the device is only busy",
                                 who(), op.description(), static_cast<double>(op.timeout.count()) / 1000.0, what));
}

void Communicator::shutdown(Deadline deadline) noexcept {
  if (comm_ == nullptr) return;
  ncclResult_t state = ncclCommFinalize(comm_);
  while (state == ncclInProgress && !deadline.expired()) {
    std::this_thread::sleep_for(kPollInterval);
    state = async_state();
  }
  if (state != ncclSuccess) {
    abort("its shutdown did not finish");
    return;
  }
  ncclCommDestroy(comm_);
  comm_ = nullptr;
  aborted_because_ = "the group was shut down";
}

void Communicator::abort(std::string reason) noexcept {
  if (comm_ == nullptr) return;
  ncclCommAbort(comm_);
  comm_ = nullptr;
  aborted_because_ = std::move(reason);
}

std::string Communicator::who() const { return fmt::format("rank {}/{} (nccl, cuda:{})", rank_, size_, device_); }

}  // namespace lockstep::nccl
