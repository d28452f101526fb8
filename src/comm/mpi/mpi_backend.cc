// mpi backend set-up, waiting, shutdown and the factory; the collectives
// live in one file each beside this one.
//
// Set-up, step by step (a group of one skips it all: it never communicates):
//   1. initialise MPI if nobody has (runtime.h);
//   2. every member publishes its MPI world rank and size in the group's
//      store and reads the others' (so every rank sees the same list, and
//      all of them fail alike if it is wrong, instead of some waiting in
//      MPI for ranks that never come);
//   3. world group: check lockstep rank == MPI world rank and size == MPI
//      world size, then MPI_Comm_idup(MPI_COMM_WORLD), polled with the
//      connect timeout; sub-group: MPI_Comm_create_group over the members'
//      world ranks (collective over the members only, so ranks outside the
//      sub-group need not take part, as new_group promises). Step 2 already
//      waited for every member, so this blocking call returns promptly; MPI
//      has no nonblocking form of it;
//   4. errors on the communicator are returned, not fatal, so they become
//      lockstep exceptions.
#include "comm/mpi/mpi_backend.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "comm/mpi/runtime.h"
#include "comm/op_stamp.h"
#include "comm/reduce_kernels.h"
#include "common/enforce.h"
#include "common/format.h"
#include "common/keep_until_exit.h"
#include "lockstep/affinity.h"
#include "common/env_vars.h"
#include "lockstep/error.h"

namespace lockstep::mpi {
namespace {

// Spin while the data could still be moving: at least kMinSpin, plus the
// time the bytes take at kSpinBytesPerSecond (a pessimistic bandwidth, so a
// slow but healthy transfer is never napped on for long). Beyond that the
// wait is for a late rank, and napping costs nothing that matters.
constexpr std::chrono::microseconds kMinSpin{100};
constexpr double kSpinBytesPerSecond = 1e9;

// FNV-1a: a hash that is the same in every process, for the tag that tells
// concurrent MPI_Comm_create_group calls apart.
std::uint64_t stable_hash(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

int tag_upper_bound() {
  int* value = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
  return flag && value ? *value : 32767;  // 32767: the least MPI guarantees
}

bool crowded_host(const BackendContext& ctx) {
  if (ctx.host_ids.empty()) return false;
  const auto here = ctx.host_ids[static_cast<std::size_t>(ctx.rank)];
  const auto local = std::count(ctx.host_ids.begin(), ctx.host_ids.end(), here);
  return local > usable_cores();
}

}  // namespace

MpiBackend::MpiBackend(const BackendContext& ctx)
    : rank_(ctx.rank),
      size_(ctx.size),
      self_(fmt::format("rank {}/{}", ctx.rank, ctx.size)),
      log_(ctx.log),
      max_count_(max_count(ctx.config.mpi_max_count)),
      crowded_(crowded_host(ctx)) {
  // A group of one never communicates (every collective returns at once),
  // so it needs neither MPI nor a communicator: a program started without
  // mpirun can still run as a world of one with LOCKSTEP_BACKEND=mpi.
  if (size_ == 1) return;
  if (!initialized() && !ctx.config.started_by_mpirun)
    throw ConfigError(fmt::format("{}: the mpi backend needs the ranks started by mpirun (Open MPI), but {} is not "
                                  "set; start the program with `mpirun -np {} ...`, or choose another backend "
                                  "(LOCKSTEP_BACKEND=auto)",
                                  self_, env::kOmpiSize, size_));
  ensure_initialized(self_, ctx.config.mpi_abort_on_failure);
  ops_.emplace();
  comm_ = create_communicator(ctx);
  log_.debug("mpi: group of {} on its own communicator, {}", size_,
             crowded_ ? "yielding while waiting (more ranks than cores)" : "spinning, then napping, while waiting");
}

MPI_Comm MpiBackend::create_communicator(const BackendContext& ctx) {
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  Store& store = *ctx.store;
  store.set(fmt::format("mpi/world/{}", rank_), fmt::format("{} {}", world_rank, world_size));
  std::vector<std::string> keys;
  for (int q = 0; q < size_; ++q) keys.push_back(fmt::format("mpi/world/{}", q));
  store.wait(keys, ctx.connect_timeout);

  std::vector<int> members(static_cast<std::size_t>(size_));
  for (int q = 0; q < size_; ++q) {
    int their_rank = -1, their_size = -1;
    std::istringstream(store.get(keys[static_cast<std::size_t>(q)])) >> their_rank >> their_size;
    if (their_size != world_size)
      throw ConfigError(fmt::format("{}: rank {} runs in an MPI job of {} processes, this rank in one of {}; every "
                                    "rank of an mpi-backend group must be started by the same mpirun",
                                    self_, q, their_size, world_size));
    if (ctx.world && (their_rank != q || size_ != world_size))
      throw ConfigError(fmt::format("{}: the mpi backend needs lockstep's ranks to be MPI's, but rank {} of this "
                                    "world of {} is MPI_COMM_WORLD rank {} of {}. Was RANK or WORLD_SIZE (or "
                                    "GroupOptions::rank/world_size) set differently from mpirun's ranks? Unset them: "
                                    "under mpirun lockstep reads OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE",
                                    self_, q, size_, their_rank, world_size));
    members[static_cast<std::size_t>(q)] = their_rank;
  }
  std::vector<int> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw ConfigError(fmt::format("{}: two ranks of this group are the same MPI process; is the group's rank list "
                                  "or the launcher's RANK wrong?",
                                  self_));

  MPI_Comm comm = MPI_COMM_NULL;
  if (ctx.world) {
    // A heap cell: if the idup times out, MPI may still write the new
    // handle into it later, so it is then left allocated.
    auto* cell = new MPI_Comm(MPI_COMM_NULL);
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Comm_idup(MPI_COMM_WORLD, cell, &request);
    const WaitOutcome outcome = test_until(request, Deadline::after(ctx.connect_timeout), kMinSpin, crowded_);
    if (!outcome.done)
      throw TimeoutError(fmt::format("{}: the ranks did not all create the group's MPI communicator within the "
                                     "connect timeout ({:.0f} s): {}; MPI does not say which rank is missing. Did "
                                     "every rank call init_process_group?",
                                     self_, static_cast<double>(ctx.connect_timeout.count()) / 1000.0,
                                     outcome.error == MPI_SUCCESS ? "timed out" : error_text(outcome.error)));
    comm = *cell;
    delete cell;
  } else {
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_incl(world_group, size_, members.data(), &group);
    const int tag = static_cast<int>(stable_hash(ctx.group_key) % (static_cast<std::uint64_t>(tag_upper_bound()) + 1));
    const int code = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (code != MPI_SUCCESS)
      throw ConfigError(fmt::format("{}: MPI_Comm_create_group failed: {}", self_, error_text(code)));
  }
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int comm_rank = -1;
  MPI_Comm_rank(comm, &comm_rank);
  LOCKSTEP_ENFORCE_EQ(comm_rank, rank_, "{}: the group's MPI communicator numbers this rank differently", self_);
  return comm;
}

MpiBackend::~MpiBackend() { shutdown(Deadline::after(Duration(0))); }

void MpiBackend::shutdown(Deadline) {
  // Nothing to tell the peers: mpirun itself tells a clean exit from a
  // crash (docs/errors.md). Only the communicator is released.
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (abandoned_) {
    // A timed-out request may still use the communicator, the user ops and
    // the scratch memory; MPI offers no way to cancel it, so all of them
    // stay allocated until the process ends.
    ops_->leak();
    keep_until_exit(std::move(accumulation_));
    keep_until_exit(std::move(staging_));
    keep_until_exit(std::move(header_));
  } else if (!finalized) {
    MPI_Comm_free(&comm_);
  }
  comm_ = MPI_COMM_NULL;
}

MpiBackend::Accumulator MpiBackend::accumulate(const void* data, std::size_t count, DType dtype, ReduceOp reduce_op,
                                               Scratch& scratch) {
  // MPI reads the caller's buffer (or reduces into it in place).
  const Accumulation values = Accumulation::in_place(Buffer{const_cast<void*>(data), count, dtype}, scratch);
  return Accumulator{values, reduction_type(values.dtype()), ops_->get(values.dtype(), reduce_op)};
}

void MpiBackend::check(int code, const OpContext& op, const char* call) const {
  if (code == MPI_SUCCESS) return;
  throw PeerError(fmt::format("{}: {} failed in {}: {}. MPI does not say which rank caused it; check the other "
                              "ranks' output",
                              self_, op.description(), call, error_text(code)));
}

std::chrono::nanoseconds MpiBackend::spin_for(std::size_t bytes) const {
  return kMinSpin + std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(bytes) / kSpinBytesPerSecond * 1e9));
}

void MpiBackend::wait(MPI_Request& request, const OpContext& op, const char* call, std::size_t bytes, int peer,
                      MPI_Status* status) {
  const WaitOutcome outcome = test_until(request, op.deadline, spin_for(bytes), crowded_, status);
  if (outcome.done) return;
  check(outcome.error, op, call);
  // Timed out. MPI cannot cancel a collective, so the request is left to
  // MPI (see shutdown) and this group is finished.
  abandoned_ = true;
  const double seconds = static_cast<double>(op.timeout.count()) / 1000.0;
  if (peer >= 0)
    throw TimeoutError(fmt::format("{}: {} timed out after {:.1f} s in {} waiting for rank {}. Rank {} is stuck, "
                                   "slower than the timeout, or issued a different sequence of operations; if it is "
                                   "only slow, raise LOCKSTEP_TIMEOUT",
                                   self_, op.description(), seconds, call, peer, peer),
                       peer);
  if (op.info.collective == Collective::recv)  // from any source
    throw TimeoutError(fmt::format("{}: {} timed out after {:.1f} s in {} waiting for a message from any rank, and "
                                   "none sent one. The ranks are stuck, slower than the timeout, or issued a "
                                   "different sequence of operations (no send to this rank); if they are only slow, "
                                   "raise LOCKSTEP_TIMEOUT",
                                   self_, op.description(), seconds, call));
  throw TimeoutError(fmt::format("{}: {} timed out after {:.1f} s in {}: some rank of this group of {} has not "
                                 "joined it, and MPI cannot say which. That rank is stuck, slower than the timeout, "
                                 "or issued a different sequence of collectives; if it is only slow, raise "
                                 "LOCKSTEP_TIMEOUT",
                                 self_, op.description(), seconds, call, size_));
}

void MpiBackend::check_agreement(const OpContext& op) {
  if (size_ == 1) return;
  const std::uint64_t what = stamp_what(op.info);
  const std::uint64_t count = stamp_count(op.info);
  std::uint64_t words[4] = {what, count, ~what, ~count};
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, words, 4, MPI_UINT64_T, MPI_BAND, comm_, &request), op, "MPI_Iallreduce");
  wait(request, op, "MPI_Iallreduce (the collective check)", sizeof words);
  if (words[0] == what && words[1] == count && words[2] == ~what && words[3] == ~count) return;
  const std::uint64_t mine[2] = {what, count};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size_));
  check(MPI_Iallgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm_, &request), op, "MPI_Iallgather");
  wait(request, op, "MPI_Iallgather (the collective check's report)", sizeof mine);
  for (int q = 0; q < size_; ++q)
    if (q != rank_)
      check_round_stamp(op, all[2 * static_cast<std::size_t>(q)], all[2 * static_cast<std::size_t>(q) + 1], q, self_);
  // Only other ranks differ among themselves: say so rather than go on with
  // a group whose ranks run different collectives.
  throw MismatchError(fmt::format("{}: {}: other ranks of this group issued different collectives at this point; "
                                  "every rank must issue the same collectives in the same order",
                                  self_, op.description()));
}

}  // namespace lockstep::mpi

namespace lockstep {

std::unique_ptr<Backend> make_mpi_backend(const BackendContext& ctx) {
  return std::make_unique<mpi::MpiBackend>(ctx);
}

}  // namespace lockstep
