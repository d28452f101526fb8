// The interface every backend folder (tcp/, shm/, hier/, mpi/, nccl/) implements. A backend
// runs one operation at a time, synchronously, on the group's progress
// thread; the ProcessGroup front end owns queueing, sequence numbers,
// argument checks and Work completion. Arguments reaching a backend are
// already validated (sizes, roots, dtypes).
//
// Thread-safety: a backend is used by one thread at a time (the progress
// thread, or the constructing thread before it starts).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/block_counts.h"
#include "common/clock.h"
#include "common/log.h"
#include "lockstep/config.h"
#include "common/os.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "lockstep/types.h"

namespace lockstep {

namespace detail {
class StreamOrder;  // comm/device_memory.h
}

class PendingCompletion;

// What one operation is, for error messages and deadlines.
struct OpContext {
  std::uint64_t seq = 0;
  OpInfo info;
  Deadline deadline = Deadline::never();
  Duration timeout{0};  // the duration the deadline was computed from
  // The clock the deadline is measured on: the group's Os (GroupOptions::
  // os), so a test can move it. Never null.
  Os* clock = &Os::real();
  // Set when the group aborts while this operation runs (another rank
  // failed, the watchdog decided): backends look at it where they wait and
  // throw OperationCancelled, so the operation ends within moments instead
  // of at its deadline. Null: never cancelled.
  const std::atomic<bool>* cancel = nullptr;
  // CUDA memory: the operation's place on the device's streams (see
  // comm/device_memory.h). Null for host memory.
  detail::StreamOrder* streams = nullptr;
  // Where a backend that has queued the operation's work (on a device
  // stream) may leave its completion instead of waiting for it: the
  // progress engine then starts the next operation at once and polls this
  // one until it is done (see PendingCompletion). Null: the backend must
  // finish the operation before returning (inline runs, host memory).
  std::unique_ptr<PendingCompletion>* defer = nullptr;

  // "allreduce #12 (float x 1000, sum)"
  std::string description() const { return describe(info, seq); }
  bool cancelled() const { return cancel != nullptr && cancel->load(std::memory_order_relaxed); }
  // Whether the deadline has passed, on the group's clock (a virtual call
  // and a clock read: for slow paths, not for every spin of a wait).
  bool expired() const { return lockstep::expired(*clock, deadline); }
};

// An operation whose work is queued but not done (an NCCL call on a
// stream). The progress engine polls it from its thread, in the order the
// operations were issued, with the operation's context: poll() returns
// true once the operation is done (and anything finishing it needs, done),
// throws its error, and does not block for long. Past the operation's
// deadline, or once the group aborts, the engine fails it if poll() has
// not. Polled on one thread at a time.
class PendingCompletion {
 public:
  virtual ~PendingCompletion() = default;
  virtual bool poll(const OpContext& op) = 0;
};

// Thrown by a backend that stopped waiting because its operation was
// cancelled; the front end completes the operation with the group's abort
// error instead, which says why.
class OperationCancelled : public Error {
 public:
  using Error::Error;
};

// Everything a backend needs to connect.
struct BackendContext {
  int rank = 0;
  int size = 1;
  // A world group (init_process_group), not a sub-group (new_group): the
  // mpi backend then requires rank == MPI world rank.
  bool world = false;
  std::shared_ptr<Store> store;  // already prefixed for this group
  std::string group_key;         // unique per group and job; peers check it on connect
  Duration timeout{0};
  Duration connect_timeout{0};
  std::vector<std::string> host_ids;  // per rank, from the rendezvous
  std::string listen_address;         // tcp: resolved by the front end
  std::size_t tcp_small_bytes = 0;    // tcp: algorithm crossover
  Config config;                      // backend settings (shm_*, mpi_*); never the environment
  Logger log;
  Os* os = &Os::real();               // the system calls (tests inject faults); outlives the backend
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;

  virtual void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) = 0;
  // Out of place (see ProcessGroup::allreduce). The default copies input
  // into output and reduces output in place.
  virtual void allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op);
  virtual void broadcast(const OpContext& op, Buffer data, int root) = 0;
  virtual void allgather(const OpContext& op, ConstBuffer input, Buffer output) = 0;
  virtual void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) = 0;
  virtual void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) = 0;
  virtual void barrier(const OpContext& op) = 0;
  // Root's `output` (size x input.count) receives every rank's input in
  // rank order; other ranks' output is empty and untouched.
  virtual void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) = 0;
  // Root's `input` holds size blocks of output.count; rank r's `output`
  // receives block r. Other ranks' input is empty.
  virtual void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) = 0;
  // Rank r sends counts.send_count(q) elements at counts.send_offset(q) of
  // its input to rank q, which receives them at counts.recv_offset(r) of
  // its output.
  virtual void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) = 0;
  // Every rank's `output` (sum of counts) receives each rank r's input
  // (counts[r] elements) in rank order.
  virtual void allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                           const std::vector<std::size_t>& counts) = 0;
  virtual void send(const OpContext& op, ConstBuffer data, int dst, int tag) = 0;
  virtual void recv(const OpContext& op, Buffer data, int src, int tag) = 0;
  // Receives the first message any peer sends to this rank and returns the
  // sender's rank. A message is taken whole, once, and one sender's
  // messages in the order sent; its header is checked as recv's, naming
  // the sender. Waits as recv does (deadline, cancellation, dead peers).
  // Called only where why_no_recv_any() is empty.
  virtual int recv_any(const OpContext& op, Buffer data, int tag) = 0;
  // Why recv_any cannot run on this backend, and what to do instead; empty
  // where it can. The front end refuses the call with it, before anything
  // is queued, so the group stays usable.
  virtual std::string why_no_recv_any() const { return {}; }

  virtual bool supports(Collective, DType, ReduceOp) const { return true; }

  // Whether this backend moves CUDA memory itself (nccl). The others get
  // CUDA memory through a staging backend (DeviceRuntime::staged_over) and
  // never see it.
  virtual bool handles_device_memory() const { return false; }

  // Operations up to this size run on the issuing thread when the group is
  // idle (see ProgressEngine). 0: never.
  virtual std::size_t inline_max_bytes() const { return 0; }

  // Clean end of the group: tell peers this rank leaves on purpose, wait (up
  // to the deadline) for theirs, release resources. Errors are swallowed:
  // a peer that already died must not make a clean exit fail.
  virtual void shutdown(Deadline deadline) = 0;

  // See ProcessGroup::allocate_shared. Called on the caller's thread, not
  // the progress thread: implementations guard their own state. The
  // default is ordinary, zeroed, 64-byte aligned memory.
  virtual std::shared_ptr<std::byte[]> allocate_shared(std::size_t bytes, Deadline deadline);
};

// Factories, one per backend folder.
std::unique_ptr<Backend> make_tcp_backend(const BackendContext& ctx);
std::unique_ptr<Backend> make_shm_backend(const BackendContext& ctx);
// shm inside each host, tcp across (hier/hier_backend.h).
std::unique_ptr<Backend> make_hier_backend(const BackendContext& ctx);
// Throws ConfigError when lockstep was built without MPI.
std::unique_ptr<Backend> make_mpi_backend(const BackendContext& ctx);
// NCCL on this rank's GPU (nccl/nccl_backend.h). Throws ConfigError when
// lockstep was built without NCCL, or when this process sees no CUDA device.
std::unique_ptr<Backend> make_nccl_backend(const BackendContext& ctx);

}  // namespace lockstep
