// ProcessGroup's private state, and the factory that forms a group from a
// store: rendezvous, backend choice, connection. Shared by
// init_process_group and ProcessGroup::new_group.
// Impl is guarded by ProcessGroup's rules (see process_group.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/device_memory.h"
#include "common/os.h"
#include "comm/group_diagnostics.h"
#include "comm/progress_engine.h"
#include "lockstep/process_group.h"

namespace lockstep {

// What it takes to form a group; the parts a sub-group inherits.
struct GroupSpec {
  int rank = 0;
  int size = 1;
  bool world = false;  // formed by init_process_group (sub-groups: false)
  std::string backend = "auto";
  std::shared_ptr<Store> root_store;  // not prefixed
  std::string key;                    // store prefix and identity of the group
  Duration timeout{0};
  Duration connect_timeout{0};
  std::string listen_address;  // empty: choose
  std::size_t tcp_small_bytes = 0;
  // This rank's host identity as given (GroupOptions::host_id,
  // LOCKSTEP_HOST_ID); empty: hostname + boot id.
  std::string host_id;
  // The front end's settings; what backends and diagnostics read instead of
  // the environment.
  Config config;
  // The system calls the backend makes (GroupOptions::os; never null).
  Os* os = &Os::real();
  // Keeps the store server (if this process hosts it) alive while any group
  // uses it.
  std::shared_ptr<void> keepalive;
  // Key every rank increments when its world group ends (empty for sub-groups).
  std::string finished_key;
  Logger log;
  // The timeline, shared by a world group and its sub-groups.
  std::shared_ptr<diag::Tracer> tracer;
  // Each member's rank in the world group (the world: 0..size-1).
  std::vector<int> world_ranks;
  // The launcher's round (lockstep run: LOCKSTEP_RESTART_COUNT), for its
  // keys about lost ranks (launcher_keys.h).
  int launcher_round = 0;
  // How long forming the group waits for its members (0: `timeout`).
  Duration rendezvous_timeout{0};
  // For a group made by shrink: the ranks of its parent it keeps.
  std::vector<int> members_of_parent;
  // Shrinks of this group so far (ProcessGroup::shrink), numbering the next.
  std::shared_ptr<std::atomic<int>> shrinks = std::make_shared<std::atomic<int>>(0);
  // Each member's start in the launcher's round, beside world_ranks (0: its
  // first; a replacement's count up): the launcher's keys about a rank's
  // end name the start that ended. Empty: all 0.
  std::vector<int> incarnations;
  // Where replacements ask to join the job's group (join_board.h): the
  // world group's and every group shrink and grow make from it; empty for
  // sub-groups, which no replacement joins.
  std::string join_board;
  // The world's size when the job started: the world ranks there are.
  int job_size = 0;
  // Formed by a replacement joining a running group (init_process_group
  // with LOCKSTEP_INCARNATION > 0): its training state comes from peers.
  bool joined = false;
  // Grows of this group so far (ProcessGroup::grow), numbering the next.
  std::shared_ptr<std::atomic<int>> grows = std::make_shared<std::atomic<int>>(0);
  // The replacements' asks last seen (join_board.h), so that a group reads
  // one counter per look while nothing is new.
  std::shared_ptr<std::atomic<std::int64_t>> asks_seen = std::make_shared<std::atomic<std::int64_t>>(0);
  int incarnation_of(int rank) const {
    return incarnations.empty() ? 0 : incarnations[static_cast<std::size_t>(rank)];
  }
  DiagnosticsSettings diagnostics;
};

struct ProcessGroup::Impl {
  GroupSpec spec;
  std::string backend_name;
  std::shared_ptr<Store> store;  // prefixed with spec.key
  std::vector<std::string> host_ids;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GroupDiagnostics> diagnostics;  // outlives the engine, which points into it
  std::unique_ptr<detail::ProgressEngine> engine;
  std::atomic<std::uint64_t> collectives{0};      // collectives issued (fingerprints number them)
  Logger log;

  std::mutex subgroups_mutex;
  std::map<std::vector<int>, int> subgroups_created;  // per rank list, how many so far

  // CUDA memory: made at the first operation on it (device_mutex guards
  // making them; once made they are only read).
  std::mutex device_mutex;
  std::unique_ptr<DeviceRuntime> device_runtime;
  std::unique_ptr<Backend> staged_backend;  // over `backend`, when it moves host memory only
};

std::shared_ptr<ProcessGroup> make_group(GroupSpec spec);

// Whether `lockstep run --on-rank-failure continue` saw start `incarnation`
// of world rank `world_rank` end, by itself or with its node (false
// without a launcher's store). Throws Error when that store does not
// answer (grow.cc).
bool launcher_saw_end(const GroupSpec& spec, int world_rank, int incarnation);

// For a replacement (LOCKSTEP_INCARNATION > 0): asks on `spec`'s join board
// to join the group the job runs now, waits until its rank 0 admits it (at
// most spec.timeout; JobFinished when the job ended first), and forms that
// group with its members. `spec` is the world's, as init_process_group
// built it (grow.cc).
std::shared_ptr<ProcessGroup> join_running_group(GroupSpec spec, int incarnation);

// With LOCKSTEP_DEBUG=DETAIL: every rank shares the fingerprint of the
// collective it is about to run and compares; a rank that issued something
// else fails everyone at once with both fingerprints and the ranks.
void check_fingerprint(Backend& backend, const OpContext& op, const OpInfo& info, std::uint64_t number, int rank,
                       int size);

// Queues a collective (numbered for fingerprints, checked in DETAIL mode).
template <typename Fn>
std::shared_ptr<Work> submit_collective(ProcessGroup::Impl& s, const OpInfo& info, Fn fn) {
  const std::uint64_t number = s.collectives++;
  if (!s.diagnostics->settings().detail || s.spec.size == 1) return s.engine->submit(info, std::move(fn));
  Backend* backend = s.backend.get();
  const int rank = s.spec.rank, size = s.spec.size;
  return s.engine->submit(info, [backend, info, number, rank, size, fn = std::move(fn)](const OpContext& ctx) {
    check_fingerprint(*backend, ctx, info, number, rank, size);
    fn(ctx);
  });
}

// The most elements of `dtype` one buffer can hold: its bytes must fit the
// largest object a process can address (PTRDIFF_MAX), so that count x
// element size cannot wrap around anywhere behind the front end.
inline std::size_t max_count(DType dtype) { return static_cast<std::size_t>(PTRDIFF_MAX) / dtype_size(dtype); }

// Whether `whole` is exactly `parts` x `part`, without computing the product
// (which can wrap around to match).
inline bool is_product(std::size_t whole, int parts, std::size_t part) {
  const auto n = static_cast<std::size_t>(parts);
  return whole % n == 0 && whole / n == part;
}

inline void check_buffer(const ConstBuffer& b, const char* what) {
  if (b.count > max_count(b.dtype))
    throw InvalidArgument(std::string(what) + ": " + std::to_string(b.count) + " elements of " +
                          std::string(to_string(b.dtype)) + " are more than any buffer can hold (at most " +
                          std::to_string(max_count(b.dtype)) +
                          "); the count is wrong: an overflow, or a length that was never set");
  if (b.count != 0 && b.data == nullptr)
    throw InvalidArgument(std::string(what) + ": the buffer has " + std::to_string(b.count) + " elements but no memory");
}

// Where an operation runs: the backend that takes its buffers, and for
// CUDA memory its place on the streams (recorded when it is routed, on the
// issuing thread).
struct Route {
  Backend* backend = nullptr;
  Device device{};
  std::shared_ptr<detail::StreamOrder> order;  // null for host memory
};

// A buffer of one call, named for messages ("input").
struct NamedBuffer {
  const char* name;
  ConstBuffer buffer;
};

// The route of a call over `buffers` (empty ones are ignored). All must be
// on one device and name one stream, else InvalidArgument; CUDA memory
// makes the group's DeviceRuntime on first use (ConfigError without CUDA).
Route route(ProcessGroup::Impl& s, const char* what, std::initializer_list<NamedBuffer> buffers);

// Queues an operation along its route: `fn(Backend&, const OpContext&)`
// runs on the routed backend, and for CUDA memory the Work carries the
// stream order, whose end is recorded when `fn` returns. Collectives are
// numbered for fingerprints; point-to-point operations (`numbered` false)
// are not.
template <typename Fn>
std::shared_ptr<Work> submit_routed(ProcessGroup::Impl& s, OpInfo info, const Route& r, Fn fn, bool numbered = true) {
  info.device = r.device;
  const auto submit = [&](auto task) {
    return numbered ? submit_collective(s, info, std::move(task)) : s.engine->submit(info, std::move(task));
  };
  if (!r.order) return submit([b = r.backend, fn = std::move(fn)](const OpContext& ctx) { fn(*b, ctx); });
  auto work = submit([b = r.backend, order = r.order, fn = std::move(fn)](const OpContext& ctx) {
    OpContext on_device = ctx;
    on_device.streams = order.get();
    order->begin();
    fn(*b, on_device);
    order->record_done();
  });
  work->attach_stream_order(r.order);
  return work;
}

// "auto" -> a concrete backend for these hosts; others are checked and kept.
std::string resolve_backend(const std::string& requested, const std::vector<std::string>& host_ids);
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendContext& ctx);

}  // namespace lockstep
