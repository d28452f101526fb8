// The shm backend: collectives through shared memory, for ranks on one host
// (the default there). Each rank owns one region (layout.h) and maps its
// peers'. Algorithms, by size:
//
//   up to 48 bytes   inline: the payload travels in the same cache line as
//                    its sequence number; one line transfer per peer
//   up to one_shot   one-shot: every rank copies its input into its slot,
//                    then every rank reduces all inputs (rank order) itself
//   larger           two-shot, pipelined: the buffer goes through in rounds
//                    of ranks x chunk bytes; in each round every rank copies
//                    the chunks others own into its slot, reduces the chunk
//                    it owns from all ranks (one fused pass) and gathers the
//                    reduced chunks of the others. Slots rotate through
//                    kSlots, so ranks may run several rounds apart; a slot
//                    is reused only after every peer consumed it.
//
// Every element is reduced in rank order 0..n-1 by exactly one kernel call,
// whatever the algorithm, so all ranks get bitwise-identical results, and
// 16-bit floats are rounded once.
//
// Buffers from allocate_shared (a collective allocation) are mapped by every
// peer; an allreduce over such a buffer skips the copy into the slots
// (single copy): peers read each other's buffers directly. Ordinary
// buffers stay where and as they are (the program's memory is its own:
// docs/algorithms.md says why they are not moved into shared memory); a
// large all-reduce or broadcast of them goes through the slots or by
// cross-memory attach, whichever measures cheaper (ordinary_paths.h).
//
// Not thread-safe: one operation at a time, on the group's progress thread
// (allocate_shared is guarded separately).
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <vector>

#include "comm/backend.h"
#include "comm/shm/handoff_copy.h"
#include "comm/shm/layout.h"
#include "comm/shm/ordinary_paths.h"
#include "comm/shm/peer_distance.h"
#include "comm/shm/region.h"
#include "comm/shm/region_sharing.h"
#include "comm/shm/shared_allocations.h"
#include "comm/op_stamp.h"
#include "comm/shm/sync.h"

namespace lockstep::shm {

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const BackendContext& ctx);
  ~ShmBackend() override;

  std::string_view name() const override { return "shm"; }
  void allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) override;
  void allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void broadcast(const OpContext& op, Buffer data, int root) override;
  void allgather(const OpContext& op, ConstBuffer input, Buffer output) override;
  void reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) override;
  void reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) override;
  void barrier(const OpContext& op) override;
  void gather(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) override;
  void all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) override;
  void allgather_v(const OpContext& op, ConstBuffer input, Buffer output, const std::vector<std::size_t>& counts) override;
  void send(const OpContext& op, ConstBuffer data, int dst, int tag) override;
  void recv(const OpContext& op, Buffer data, int src, int tag) override;
  int recv_any(const OpContext& op, Buffer data, int tag) override;
  void shutdown(Deadline deadline) override;
  std::size_t inline_max_bytes() const override { return one_shot_max_; }
  std::shared_ptr<std::byte[]> allocate_shared(std::size_t bytes, Deadline deadline) override;

  // Defaults, measured on a 2-core host (docs/performance.md); overridable
  // with LOCKSTEP_SHM_ONESHOT_BYTES and LOCKSTEP_SHM_CHUNK_BYTES. One-shot
  // reads every peer's whole input, so its crossover falls as ranks grow:
  // 256 KiB / ranks, within [16 KiB, 128 KiB].
  static std::size_t default_one_shot_bytes(int ranks) {
    return std::clamp<std::size_t>(256 * 1024 / static_cast<std::size_t>(std::max(ranks, 1)), 16 * 1024, 128 * 1024);
  }
  static constexpr std::size_t kDefaultChunkBytes = 128 * 1024;

 private:
  // Lays out a new region's control block and counters (set-up).
  void init_control_block(std::byte* region) const;
  // Accessors into rank q's region.
  ControlBlock& control(int q) const { return *reinterpret_cast<ControlBlock*>(base_[static_cast<std::size_t>(q)]); }
  std::byte* slot(int q, std::uint64_t round) const {
    return base_[static_cast<std::size_t>(q)] + layout_.slots + (round % kSlots) * layout_.slot_bytes;
  }
  Counter& p2p_sent(int q, int to) const;
  Counter& p2p_received(int q, int from) const;
  std::byte* mailbox(int q, int to, std::uint64_t chunk) const;
  // A peer whose next message to this rank has arrived (its first chunk
  // is posted), looking at the ranks after `after` first; -1 if none.
  int peer_with_message(int after) const;

  // Round protocol (see layout.h). begin_round waits until every peer has
  // consumed what this rank's slot held kSlots rounds ago, and returns the
  // round number.
  std::uint64_t begin_round(const OpContext& op);
  void wait_all(Counter ControlBlock::*counter, std::uint64_t target, const OpContext& op, const char* what) const;
  void wait_one(int q, Counter ControlBlock::*counter, std::uint64_t target, const OpContext& op, const char* what) const;
  // Round g's arrive: posted with this operation's stamp; waiting for a
  // peer's checks its stamp against this operation (op_stamp.h).
  void post_arrive(std::uint64_t g, const OpContext& op) {
    control(rank_).distance_probe.value.store(g + 1, std::memory_order_relaxed);
    control(rank_).arrive.post_stamped(g + 1, stamp_what(op.info), stamp_count(op.info));
  }
  void wait_arrived(int q, std::uint64_t g, const OpContext& op, const char* what) const;
  void wait_arrived_all(std::uint64_t g, const OpContext& op, const char* what) const;

  // An inline operation: publishes `bytes` of payload (may be 0) in this
  // rank's line and returns the operation number; peers' payloads are read
  // with inline_payload() after wait_inline().
  std::uint64_t post_inline(const void* payload, std::size_t bytes, const OpContext& op);
  // With `check`, compares the peer's stamp with this operation (off where
  // the line carries something other than the operation's own data).
  // `what` names the wait in errors ("its part of a small operation").
  void wait_inline(int q, std::uint64_t seq, const OpContext& op, const char* what, bool check = true) const;
  const unsigned char* inline_payload(int q, std::uint64_t seq) const { return control(q).lines[seq % 2].payload; }

  void allreduce_inline(const OpContext& op, Buffer data, ReduceOp reduce_op);
  void allreduce_one_shot(const OpContext& op, Buffer data, ReduceOp reduce_op);
  // Two-shot over `data`; when `gather_to` is a rank, only that rank gathers
  // the result and nobody's input buffer is written except the root's.
  void reduce_two_shot(const OpContext& op, Buffer data, ReduceOp reduce_op, int gather_to);
  // Two-shot between buffers in shared memory that every rank maps:
  // input[q] and output[q] are where rank q's elements begin, in this
  // rank's address space (input and output may be the same). Peers' inputs
  // and reduced chunks are read in place, nothing goes through the slots.
  void allreduce_shared(const OpContext& op, std::size_t count, DType dtype, ReduceOp reduce_op,
                        const std::vector<std::byte*>& input, const std::vector<std::byte*>& output);
  // Ordinary buffers by cross-memory attach, no slots (allreduce.cc).
  void allreduce_single_copy(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op);
  // How one kind of operation (all-reduces, broadcasts) chooses its way for
  // ordinary buffers under LOCKSTEP_SHM_ORDINARY_PATH=auto.
  struct PathChoice {
    const char* what;  // "all-reduces": for the log
    OrdinaryPaths costs;
    std::uint64_t chosen = 0;  // operations it chose for; the same on every rank
    OrdinaryPaths::Path last = OrdinaryPaths::Path::slots;
  };
  // Runs `run(path)` for an ordinary buffer of `bytes`: the way the setting
  // fixes, or under auto the way every rank's vote chooses (one inline
  // exchange, or a refresh forced by the count), timed for the next votes.
  void run_ordinary(const OpContext& op, PathChoice& choice, std::size_t bytes,
                    const std::function<void(OrdinaryPaths::Path)>& run);
  OrdinaryPaths::Path choose_path(const OpContext& op, PathChoice& choice, std::size_t bytes);
  void broadcast_through_slots(const OpContext& op, Buffer data, int root);
  // inline, one-shot or two-shot by size, through the slots.
  void allreduce_ordinary(const OpContext& op, Buffer data, ReduceOp reduce_op);
  // One inline exchange of `bytes` (at most kInlineBytes) from every rank:
  // every rank's, this one's included, lands in rank order at `every_rank`
  // (size x bytes). Peers' stamps are not checked here: the rounds that
  // follow check them. `what` names the wait in errors.
  void exchange_inline(const OpContext& op, const void* mine, std::size_t bytes, const char* what, void* every_rank);
  // Whether every rank passed its copies of the same shared allocations at
  // the same offsets, for input and output (decided from every rank's
  // answer, so all agree). Returns the locations then.
  std::optional<std::pair<SharedAllocations::Location, SharedAllocations::Location>> agree_on_shared_buffers(
      const OpContext& op, ConstBuffer input, ConstBuffer output);

  // Single copy (single_copy.h): whether every rank can read every peer's
  // memory, decided at set-up from every rank's probe; then the block
  // collectives copy blocks of at least kSingleCopyBytes straight from the
  // peer's buffer.
  // "" or why this rank cannot read its peers' memory.
  std::string probe_single_copy() const;
  bool single_copy(std::size_t block_bytes) const {
    return single_copy_ && single_copy_bytes_ > 0 && block_bytes >= single_copy_bytes_;
  }
  // Round g of a single-copy operation: publish this rank's buffer address,
  // then read_from(q, address) per peer, then wait until every peer has
  // finished reading this rank's buffer.
  void single_copy_round(const OpContext& op, const void* mine, bool read_everyone, int only_from,
                         const std::function<void(int q, const std::byte* theirs)>& read_from);
  void broadcast_single_copy(const OpContext& op, Buffer data, int root);
  void read_peer_or_throw(const OpContext& op, int q, void* local, const void* remote, std::size_t bytes) const;
  void write_peer_or_throw(const OpContext& op, int q, void* remote, const void* local, std::size_t bytes) const;
  // A PeerError naming rank q and the operation unless `why` is "".
  void throw_if_failed(const OpContext& op, int q, const char* verb, const std::string& why) const;
  // Measured on 2 cores against the slots (docs/performance.md); below it
  // the system call costs more than the second copy.
  static constexpr std::size_t kDefaultSingleCopyBytes = 32 * 1024;

  // Copies into this rank's slots and mailboxes, which a peer reads next:
  // copies of kStreamingBytes or more with streaming stores while the peers
  // are far (peer_distance.h), or always or never (LOCKSTEP_SHM_STREAMING_STORES).
  void to_slot(void* dst, const void* src, std::size_t bytes) const {
    copy_for_peer(dst, src, bytes, streaming() ? kStreamingBytes : 0);
  }
  bool streaming() const {
    return streaming_stores_ == ShmStreamingStores::always ||
           (streaming_stores_ == ShmStreamingStores::automatic && peer_distance_.far());
  }
  static constexpr std::size_t kStreamingBytes = 64 * 1024;
  // Times the load of peer q's probe line, which it wrote just before
  // posting round g (post_arrive), every kDistanceEvery rounds.
  void sample_peer_distance(int q) const;
  static constexpr std::uint64_t kDistanceEvery = 4;

  // The waits' divergence checks (sync.h). Ranks that issued the same
  // collectives have begun the same rounds and small operations, so a
  // peer found beyond this rank's count on the other path while this rank
  // waits issued something else here: a small operation where this rank's
  // took rounds, or the reverse (12 floats against 13, f32 against f64).
  // Its stamp on that path names what it issued.
  class PeerBeganARound final : public DivergenceCheck {  // for small operations' waits
   public:
    explicit PeerBeganARound(const ShmBackend& shm) : shm_(shm) {}
    void check(int peer, const OpContext& op) const override;

   private:
    const ShmBackend& shm_;
  };
  class PeerBeganASmallOperation final : public DivergenceCheck {  // for rounds' waits
   public:
    explicit PeerBeganASmallOperation(const ShmBackend& shm) : shm_(shm) {}
    void check(int peer, const OpContext& op) const override;

   private:
    const ShmBackend& shm_;
  };

  int rank_;
  int size_;
  std::string self_;
  std::vector<pid_t> pids_;
  bool single_copy_ = false;
  // Ordinary buffers of large all-reduces and broadcasts: through the
  // slots, by single copy, or as measured (LOCKSTEP_SHM_ORDINARY_PATH;
  // agreed at set-up; the slots where single copy is not possible).
  ShmOrdinaryPath ordinary_path_ = ShmOrdinaryPath::slots;
  PathChoice allreduce_paths_{"all-reduces", {}};
  PathChoice broadcast_paths_{"broadcasts", {}};
  std::vector<std::byte> single_copy_scratch_;  // peers' pieces, one per peer
  std::size_t single_copy_bytes_ = kDefaultSingleCopyBytes;  // LOCKSTEP_SHM_SINGLE_COPY_BYTES; 0: off
  std::shared_ptr<Store> store_;
  Os& os_;  // shared-memory segments are created and mapped through it
  std::string nonce_;  // segment names' stem: the launcher's tag (if any) and the group's nonce
  // Every rank's stem: ranks started by different launchers on one host
  // (two nodes of a job on one machine) have different tags.
  std::vector<std::string> stems_;
  Logger log_;
  ShmStreamingStores streaming_stores_;
  mutable PeerDistance peer_distance_;  // sampled in the waits (const: they only observe)
  std::int64_t clock_cost_nanos_;       // taken off each sample
  std::size_t one_shot_max_;
  std::size_t chunk_bytes_;
  Layout layout_;
  Region own_;
  std::vector<Region> peer_regions_;
  RegionSharing region_sharing_;  // how shared allocations are shared, as the regions were
  std::vector<std::byte*> base_;  // base_[q]: rank q's region, own included
  PeerWatch watch_;
  Waiter waiter_;
  std::uint64_t rounds_ = 0;       // rounds begun; the same on every rank
  std::uint64_t inline_ops_ = 0;   // inline operations begun; the same on every rank
  PeerBeganARound peer_began_a_round_{*this};
  PeerBeganASmallOperation peer_began_a_small_operation_{*this};
  std::vector<std::uint64_t> p2p_chunks_sent_;      // per peer
  std::vector<std::uint64_t> p2p_chunks_received_;  // per peer
  int last_any_source_ = 0;                         // the sender recv_any took last; the next looks after it first
  std::vector<const void*> sources_;  // scratch for kernel source lists
  std::shared_ptr<SharedAllocations> allocations_ = std::make_shared<SharedAllocations>();
  std::mutex allocate_mutex_;                      // serialises allocate_shared callers
  std::atomic<std::uint64_t> allocations_made_{0};  // the same on every rank (collective)
};

}  // namespace lockstep::shm
