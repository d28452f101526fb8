// Process groups: a set of ranks that run collectives together, and the Work
// handle each asynchronous collective returns.
//
//   auto pg = lockstep::init_process_group();          // from the launcher's environment
//   std::vector<float> grad(n);
//   auto work = pg->allreduce(lockstep::view(std::span(grad)), lockstep::ReduceOp::avg);
//   ...                                                 // overlap other work
//   work->wait();                                       // rethrows the collective's error
//
// Contract: every rank of a group issues the same collectives in the same
// order (with matching counts and dtypes). Each group runs its operations one
// at a time, in issue order, on its own progress thread, so issuing returns at
// once. Buffers belong to the caller and must stay valid until the Work is
// done. A failed collective (a dead peer, a timeout) aborts the group: later
// operations fail at once with the first error instead of hanging.
//
// Thread-safety: ProcessGroup methods may be called from any thread; calls
// from several threads are ordered by the group's internal lock (the order in
// which they take it is the issue order, which must then match across ranks).
// Work is thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/config.h"
#include "lockstep/error.h"
#include "lockstep/store.h"
#include "lockstep/types.h"

namespace lockstep {

namespace detail {
class ProgressEngine;
class StreamOrder;
}

// The handle of one asynchronous operation.
class Work {
 public:
  // `started_us`: 0 until the operation starts (see mark_started).
  Work(std::uint64_t seq, const OpInfo& info, std::int64_t issued_us, std::int64_t started_us = 0);

  // Waits until the operation finished and rethrows its error, if any. If it
  // is still running after `timeout`, throws TimeoutError (the operation goes
  // on; its own deadline is the group's timeout).
  //
  // CUDA memory: "finished" means its device work is queued; wait() then
  // makes the buffers' stream wait for that work without blocking the host,
  // so kernels queued there next see the result (as c10d's Work::wait()).
  void wait(Duration timeout = Duration::max());
  // wait(), and for CUDA memory the host also waits until the device work
  // is done (the result can be read from another stream, or copied out).
  // Throws TimeoutError when `timeout` passes first. Host memory: wait().
  void synchronize(Duration timeout = Duration::max());
  bool done() const;
  // The operation's exception, or null while running or after success.
  std::exception_ptr error() const;

  // Runs `callback` once the operation is done (successfully or not), before
  // waiters are released: on the thread that ran the operation, or at once
  // on this thread if already done. Keep callbacks short; they delay the
  // group's next operation. A callback must not throw.
  void on_complete(std::function<void(const Work&)> callback);

  // A Work that finishes once `continuation` has run on this one's outcome,
  // as c10d's Future::then: it fails with this Work's error if this one
  // fails (the continuation is not run), with the continuation's exception
  // if that throws, and succeeds otherwise. The continuation runs once this
  // Work counts as done, on the thread that finished it (or at once on this
  // thread if it is done already); chains (a->then(f)->then(g)) and
  // siblings (a->then(f); a->then(g)) run in order.
  // For CUDA memory it carries this Work's stream order: waiting on it
  // orders the caller's stream after this operation's device work.
  std::shared_ptr<Work> then(std::function<void(const Work&)> continuation);

  std::uint64_t seq() const { return seq_; }
  Collective collective() const { return info_.collective; }
  const OpInfo& info() const { return info_; }
  // E.g. "allreduce #12 (float x 1000, sum)".
  std::string description() const { return describe(info_, seq_); }
  // The rank a recv's message came from, as c10d's Work::sourceRank(): the
  // source a recv named, or for recv_any the rank that sent the message,
  // known once it has arrived (completion callbacks see it; -1 before, if
  // the recv failed first, and for every other operation).
  int source_rank() const;
  // Set by the process group on an operation over CUDA memory.
  void attach_stream_order(std::shared_ptr<detail::StreamOrder> order);
  // Set by the process group on a recv_any: where the operation writes the
  // sender's rank once it has received the message.
  void attach_source(std::shared_ptr<const std::atomic<int>> source);
  // Steady-clock microseconds: when the operation was issued, started and
  // finished; 0 if not yet. Operations short enough to run on the issuing
  // thread are stamped at the kernel tick's resolution (1-4 ms) unless a
  // timeline is being written (LOCKSTEP_TRACE); others to the microsecond.
  std::int64_t issued_us() const { return issued_us_; }
  std::int64_t started_us() const;
  std::int64_t finished_us() const;

 private:
  friend class detail::ProgressEngine;
  void mark_started(std::int64_t at_us);
  void complete(std::exception_ptr error, std::int64_t finished_us);

  const std::uint64_t seq_;
  const OpInfo info_;
  const std::int64_t issued_us_;
  mutable std::mutex mutex_;
  std::condition_variable finished_;
  std::atomic<bool> done_{false};  // set last, with release: a done Work needs no lock to read
  std::exception_ptr error_;
  std::int64_t started_us_ = 0;
  std::int64_t finished_us_ = 0;
  std::vector<std::function<void(const Work&)>> callbacks_;
  std::vector<std::function<void(const Work&)>> continuations_;  // then(): run once done_ is set
  std::shared_ptr<detail::StreamOrder> stream_order_;  // set before the Work is handed out
  std::shared_ptr<const std::atomic<int>> source_;     // recv_any only; set before the Work is handed out
};

// Waits for every Work in `works`, even after one failed, and then
// rethrows the first failure in their order. Waiting only up to the first
// failure would return while later operations still write into the caller's
// buffers.
void wait_all(const std::vector<std::shared_ptr<Work>>& works);

// How to form a group. Every field has a default taken from `config`, which
// is read from the environment the launcher set (lockstep run, torchrun,
// mpirun, srun) unless given; see docs/env.md.
struct GroupOptions {
  // Every environment setting, parsed and checked. Null:
  // Config::from_environment(). Given: the environment is not read at all.
  // The fields below override it.
  std::optional<Config> config;
  // "auto" (default, or LOCKSTEP_BACKEND): shared memory when every rank is on
  // one host; "hier" (shared memory inside each host, TCP across) when the
  // ranks span hosts and some host runs several; TCP when every host runs
  // one. Or "tcp", "shm", "hier" (on one host it is shm), "mpi" or "nccl" (when built;
  // nccl needs one GPU per rank).
  std::string backend;
  // Rank and world size; -1: from the environment (RANK / WORLD_SIZE,
  // OMPI_COMM_WORLD_*, SLURM_*). With neither set anywhere, the program runs
  // as a world of one.
  int rank = -1;
  int world_size = -1;
  // The rendezvous store. Null: a TcpStore at MASTER_ADDR:MASTER_PORT, hosted
  // by rank 0 unless the launcher hosts it.
  std::shared_ptr<Store> store;
  std::string master_addr;  // empty: MASTER_ADDR
  int master_port = -1;     // -1: MASTER_PORT
  // Deadline of every collective (default LOCKSTEP_TIMEOUT, else 5 minutes).
  std::optional<Duration> timeout;
  // How long to keep trying to reach the store and peers at start-up
  // (default LOCKSTEP_CONNECT_TIMEOUT, else 60 s).
  std::optional<Duration> connect_timeout;
  // TCP backend: the address peers connect to (default LOCKSTEP_SOCKET_ADDR,
  // else the address this host uses to reach the store, or loopback when all
  // ranks are on one host).
  std::string listen_address;
  // TCP backend: messages up to this many bytes use the latency-optimal
  // algorithm, larger ones the bandwidth-optimal one (default
  // LOCKSTEP_TCP_SMALL_BYTES, else a measured crossover).
  std::optional<std::size_t> tcp_small_bytes;
  // This rank's host identity (default LOCKSTEP_HOST_ID, else hostname +
  // boot id). Ranks with equal identities share memory, so this may only
  // group ranks that really run on one machine: it lets ranks of one machine
  // pose as several hosts (testing hier), never the reverse.
  std::string host_id;
  // Distinguishes independent groups that share one store.
  std::string name = "world";
  // The system calls (socket I/O, the clock, shared memory) this group, its
  // sub-groups and the store it creates go through. Null: the real ones.
  // Tests inject faults here (see src/common/os.h); it must outlive the
  // group.
  Os* os = nullptr;
};

class ProcessGroup {
 public:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  // Finishes queued operations, says goodbye to the peers (so they can tell a
  // clean exit from a crash) and releases the connections. Destroy the group
  // before the process exits.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const std::string& backend() const;
  Duration timeout() const;
  // The settings the group was formed with (sub-groups share their parent's).
  const Config& config() const;
  const std::shared_ptr<Store>& store() const;
  // Identity of each rank's host (hostname and boot id), from the rendezvous.
  const std::vector<std::string>& host_ids() const;
  // True once an operation failed and the group aborted.
  bool aborted() const;
  // Aborts the group on every rank, for a program that finds it cannot go
  // on while other ranks wait in collectives (a data loader failed, a test
  // assertion fired): this rank's running operation is cancelled and its
  // queued and later ones fail with an Error carrying `reason`; the other
  // ranks' groups abort with the same reason within about half a second
  // (their watchdogs read it from the store). No effect on a group that
  // already aborted.
  void abort(const std::string& reason);

  // Reductions take a ReduceOp (`ReduceOp::sum`) or a Reduction, which also
  // carries premul_sum's factor (`Reduction::premul_sum(0.25)`: every rank's
  // input is multiplied by 0.25, then summed; floating types only).
  //
  // In place: every rank's `data` becomes the reduction of all ranks' `data`.
  std::shared_ptr<Work> allreduce(Buffer data, Reduction op = ReduceOp::sum);
  // Out of place: every rank's `output` becomes the reduction of all ranks'
  // `input`, which is left unchanged (the same memory is allowed: then it is
  // the in-place form). With the shm backend and both buffers from
  // allocate_shared, no copy is made.
  std::shared_ptr<Work> allreduce(ConstBuffer input, Buffer output, Reduction op = ReduceOp::sum);
  // Every rank's `data` becomes root's.
  std::shared_ptr<Work> broadcast(Buffer data, int root);
  // `output` (size() * input.count elements) receives every rank's input, in rank order.
  std::shared_ptr<Work> allgather(ConstBuffer input, Buffer output);
  // The same with per-rank counts (MPI_Allgatherv): rank r contributes
  // counts[r] elements (its input.count), and `output` (the sum of counts)
  // receives them in rank order. Every rank passes the same counts; ranks
  // that disagree fail with MismatchError.
  std::shared_ptr<Work> allgather(ConstBuffer input, Buffer output, std::vector<std::size_t> counts);
  // `input` holds size() blocks of output.count elements; rank r's `output`
  // receives the reduction of every rank's block r.
  std::shared_ptr<Work> reduce_scatter(ConstBuffer input, Buffer output, Reduction op = ReduceOp::sum);
  // Root's `data` becomes the reduction; other ranks' `data` is left unchanged.
  std::shared_ptr<Work> reduce(Buffer data, int root, Reduction op = ReduceOp::sum);
  // Root's `output` (size() * input.count elements) receives every rank's
  // input, in rank order. Other ranks' output is not used (pass {}).
  std::shared_ptr<Work> gather(ConstBuffer input, Buffer output, int root);
  // Root's `input` holds size() blocks of output.count elements; rank r's
  // `output` receives block r. Other ranks' input is not used (pass {}).
  std::shared_ptr<Work> scatter(ConstBuffer input, Buffer output, int root);
  // Equal blocks (MPI_Alltoall): input and output hold size() blocks of
  // input.count / size() elements; block q of the input goes to rank q,
  // block q of the output comes from rank q.
  std::shared_ptr<Work> all_to_all(ConstBuffer input, Buffer output);
  // Per-rank counts (MPI_Alltoallv; torch's split sizes): input_counts[q]
  // elements go to rank q and output_counts[q] come from rank q, blocks
  // packed in rank order. Each rank passes its own counts; the ranks
  // exchange them first, and if rank r's input_counts[q] is not rank q's
  // output_counts[r], every rank fails with a MismatchError naming the pairs.
  std::shared_ptr<Work> all_to_all(ConstBuffer input, std::vector<std::size_t> input_counts, Buffer output,
                                   std::vector<std::size_t> output_counts);
  std::shared_ptr<Work> barrier();
  // The reduction over logical shards (docs/faults.md): holder[s] is the
  // rank holding shard s (the same map on every rank; its length is the
  // number of shards), and each rank passes the buffers of the shards it
  // holds, in ascending shard order, each output.count elements. Every
  // element of every rank's output becomes op(...op(op(shard 0, shard 1),
  // shard 2)..., shard n-1) (avg: divided by n), combined in that order by
  // the same kernel whatever rank holds which shard: the bits are the same
  // in any group, and the same as a shm all-reduce of groups where rank s
  // holds shard s (which is what runs there). Host memory; sum, avg, min,
  // max, prod.
  std::shared_ptr<Work> reduce_shards(std::vector<ConstBuffer> held, std::vector<int> holder, Buffer output,
                                      Reduction op = ReduceOp::avg);
  // The all-gather and the reduce-scatter of a sharded step over logical
  // shards (docs/faults.md, "Logical shards"): the output of n shards is n
  // blocks, block s belonging to shard s, whatever rank holds it.
  //   allgather_shards: each rank passes its held shards' blocks (ascending
  //   shard order, output.count / n elements each); every rank's output
  //   becomes every block in shard order.
  //   reduce_scatter_shards: each rank passes its held shards' whole inputs
  //   (ascending, n blocks each) and one output block per held shard;
  //   output block s becomes op(...op(op(input 0, input 1), input 2)...,
  //   input n-1), block s of each input, combined in that order by the
  //   same kernel whatever rank holds which shard (avg: divided by n), the
  //   same bits as reduce_shards' block s, and as a shm reduce_scatter of
  //   groups where rank s holds shard s (which is what runs there).
  // Host memory; outputs must not overlap inputs; in reduce_scatter_shards
  // every rank holds at least one shard. Same checks as reduce_shards.
  std::shared_ptr<Work> allgather_shards(std::vector<ConstBuffer> held, std::vector<int> holder, Buffer output);
  std::shared_ptr<Work> reduce_scatter_shards(std::vector<ConstBuffer> held, std::vector<int> holder,
                                              std::vector<Buffer> outputs, Reduction op = ReduceOp::avg);
  // Point to point. A send and its recv must agree on size, dtype and tag.
  std::shared_ptr<Work> send(ConstBuffer data, int dst, int tag = 0);
  std::shared_ptr<Work> recv(Buffer data, int src, int tag = 0);
  // A recv from any other rank (MPI_ANY_SOURCE; torch.distributed's recv
  // without src): takes the first message sent to this rank by any peer,
  // and Work::source_rank() then says who sent it. Messages are never lost
  // or taken twice, and one sender's messages arrive in the order it sent
  // them; among senders the order is not defined. The message taken must
  // agree with `data` and `tag` as for recv (it is not skipped for a later
  // one that would), or the recv fails with a MismatchError naming the
  // sender: a sender that may run ahead to messages of another size needs
  // ordering (a barrier between the phases). Refused (InvalidArgument)
  // where the backend cannot receive without naming the peer (nccl), and
  // in a group of one.
  std::shared_ptr<Work> recv_any(Buffer data, int tag = 0);

  bool supports(Collective collective, DType dtype, ReduceOp op = ReduceOp::sum) const;

  // A new group of the given ranks of this group; rank i of the new group is
  // ranks[i]. Called by exactly the ranks listed (others need not call it),
  // with the same list. Groups with the same list are told apart by the order
  // of creation.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

  // Each rank of this group's rank in the world group (the group
  // init_process_group formed); for the world itself 0..size()-1.
  const std::vector<int>& world_ranks() const;

  // The group re-formed in place among the ranks still here, after this
  // one failed because ranks were lost (docs/faults.md, "The group shrinks
  // in place"). Every rank that goes on calls it on the failed group:
  //   - each says in the store that it is here;
  //   - a rank named in `lost` (this group's ranks: a PeerError's peer), or
  //     that `lockstep run --on-rank-failure continue` saw end, is not
  //     waited for; any other that has not said so within `window` is left
  //     out (a frozen or cut-off rank);
  //   - the first list of members stored is the one every rank adopts, so
  //     all form the same group;
  //   - the members must be more than half of the ranks not known to have
  //     ended (those the launcher saw end, as the rank that stored the
  //     members read them: one verdict for all), or every rank stops: the
  //     side of a partition without a majority never goes on alone.
  // Returns the new group (its rank i is members_of_parent()[i] of this
  // one; world_ranks() says which world ranks it keeps). Throws PeerError
  // naming this rank itself on a rank that was left out (it must stop: the
  // others go on without it); PeerError naming no rank (-1) where the
  // re-formed group could not be connected (a member lost meanwhile: call
  // shrink again on this group; each call is a new attempt); Error where
  // there is no majority; ConfigError on mpi and nccl, which cannot
  // re-form in place (docs/faults.md says what they offer).
  std::shared_ptr<ProcessGroup> shrink(const std::vector<int>& lost, Duration window = std::chrono::seconds(10));
  // For a group made by shrink: the ranks of the group it was made from,
  // in its rank order (empty otherwise).
  const std::vector<int>& members_of_parent() const;

  // Replacements (docs/faults.md, "Replacements join the running group").
  // Under `lockstep run --on-rank-failure continue --max-replacements N`
  // the launcher starts a new process for a rank that died; its
  // init_process_group does not form the world but asks to join the group
  // the job runs now, and returns once it is a member.
  //
  // The world ranks of replacements waiting to join this group, ascending
  // (a replacement whose process ended meanwhile is not listed). Reads the
  // launcher's store: one counter while no replacement is new. Any rank
  // may call it; grow adopts its rank 0's answer.
  std::vector<int> replacements_waiting();
  // The world ranks outside this group whose latest start the launcher
  // has made and that have neither been admitted nor ended: those waiting
  // and those still starting (loading, connecting), which ask to join in
  // moments. Reads the launcher's store, a few keys per world rank outside
  // the group (empty where the ranks cannot read it); for the moment after
  // a loss, when waiting briefly for a replacement can cost less than a
  // step without it.
  std::vector<int> replacements_started();
  // The world ranks outside this group whose last start was a member and
  // ended, but whose launcher has not yet said so, where the launchers
  // start replacements (LOCKSTEP_MAX_REPLACEMENTS): the launcher may be
  // about to start one (it counts a replacement's start before it says
  // the end, so once the end is said, replacements_started() lists it).
  // Empty where no launcher replaces ranks. A launcher that died with its
  // node never says: wait on this briefly, not for long.
  std::vector<int> ends_unseen_by_launcher();
  // Collective over every rank of this group: the group grown by
  // replacements, its members in world-rank order. Rank 0 passes the
  // replacements to admit (replacements_waiting()); the others' lists are
  // ignored, and every rank adopts rank 0's. Returns nullptr, on every
  // rank, when none of them still waits. The replacements are told the new
  // group's key and form it with the members within `window`; else Error
  // (a replacement ended before it came): this group is intact, and the
  // members agree on it (an allreduce here, for instance) before they go
  // on with it.
  std::shared_ptr<ProcessGroup> grow(const std::vector<int>& replacements, Duration window = std::chrono::seconds(10));
  // Whether this process joined a running group as a replacement: its
  // model and optimizer state must come from its peers (ResilientTrainer
  // does that), and its group's rank and size are those of the group it
  // joined, not its world rank and the world's size.
  bool joined() const;
  // The world's size when the job started (the world ranks there are).
  int job_size() const;
  // No replacement joins after this: one waiting, or started later, is
  // told the job finished (init_process_group throws JobFinished). Any
  // rank may call it, once its job's work is done.
  void close_to_replacements();

  // Diagnostics (see docs/diagnostics.md).
  // Names operation `seq` (Work::seq) in the flight recorder and the
  // timeline, e.g. "bucket 3".
  void annotate(std::uint64_t seq, std::string label);
  // Whether this rank writes a timeline (LOCKSTEP_TRACE is set).
  bool tracing() const;
  // Adds an event to this rank's timeline; times are steady-clock
  // microseconds (lockstep::trace_now_us). `track` groups events ("step",
  // "data"). Free when tracing is off.
  void trace(std::string name, std::string track, std::int64_t start_us, std::int64_t end_us);
  // Writes this group's flight recorder (its last operations) to a file
  // now, as on a failure or SIGUSR1, and returns the file's path.
  std::string dump_flight_recorder(const std::string& reason = "requested");

  // Memory that this group's collectives can use in place. On the shm
  // backend every rank maps every other rank's allocation, so an operation
  // over a buffer inside it skips the copy into shared slots (single copy):
  // peers read it directly. Collective: every rank of the group calls it
  // with the same size, in the same order (with no operation in flight
  // between, as for any collective). Zeroed, 64-byte aligned; released when
  // the last copy of the pointer goes, which may outlive the group. On
  // other backends it is ordinary memory.
  std::shared_ptr<std::byte[]> allocate_shared(std::size_t bytes);

 private:
  std::unique_ptr<Impl> impl_;
};

// Forms the default group from options and the launcher's environment:
// resolves rank and world size, reaches (or hosts) the store, checks that all
// ranks agree on the world size, and connects the backend. Throws ConfigError
// with the cause and the fix when the environment is wrong.
std::shared_ptr<ProcessGroup> init_process_group(GroupOptions options = {});

}  // namespace lockstep
