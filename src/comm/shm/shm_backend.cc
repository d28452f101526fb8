// shm backend set-up, the round and inline protocols, and the factory; the
// collectives live in one file each beside this one.
//
// Set-up, step by step:
//   1. rank 0 draws a random nonce for the job and shares it through the
//      store, so two jobs on one host never share a region name;
//   2. each rank publishes its pid, pid namespace and allowed CPUs;
//   3. each rank creates its region (zero-filled by itself: first touch),
//      initialises its control block, and every rank maps every peer's
//      (region_sharing.h: without a name in /dev/shm where ranks may open
//      each other's descriptors, so nothing can be left there whatever
//      happens); each checks its peers' magic numbers.
#include "comm/shm/shm_backend.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstring>
#include <new>
#include <sstream>

#include <fmt/format.h>

#include "common/env_vars.h"
#include "comm/shm/single_copy.h"
#include "common/host.h"
#include "lockstep/error.h"

namespace lockstep::shm {
namespace {

std::string pid_namespace() {
  char buf[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "unknown";
}

// This process's allowed CPUs as a hex mask string.
std::string affinity_mask() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) out.push_back(CPU_ISSET(c, &set) ? '1' : '0');
  return out;
}

// Ranks outnumber cores when the union of every rank's allowed CPUs is
// smaller than the number of ranks: then a spinning rank steals the core
// its peer needs, and waits must yield at once. (Ranks pinned one per core
// are not oversubscribed, though each sees a single CPU.)
bool oversubscribed(const std::vector<std::string>& masks) {
  std::string all(CPU_SETSIZE, '0');
  for (const auto& m : masks)
    for (std::size_t c = 0; c < m.size() && c < all.size(); ++c)
      if (m[c] == '1') all[c] = '1';
  return std::count(all.begin(), all.end(), '1') < static_cast<long>(masks.size());
}

// How long a wait spins before it sleeps, when ranks have a core each:
// adaptive (spin_budget.h) unless LOCKSTEP_SHM_SPIN_US fixes it.
SpinBudget spin_budget(const Config& config) {
  return config.shm_spin_micros ? SpinBudget::fixed(*config.shm_spin_micros * 1000) : SpinBudget::adaptive();
}

std::string wait_policy(bool crowded, const SpinBudget& budget) {
  if (crowded) return "yielding (more ranks than cores)";
  if (budget.is_fixed()) return fmt::format("spinning {} us", budget.nanos() / 1000);
  return fmt::format("spinning {} to {} us (adaptive)", SpinBudget::kFloorNanos / 1000, SpinBudget::kCeilingNanos / 1000);
}

// The part of this rank's segment names before what the segment is for:
// the launcher's tag (LOCKSTEP_SHM_TAG), when there is one, then the group's
// nonce. Each rank uses its own launcher's tag, so a launcher that removes
// "lockstep.<tag>.*" removes exactly what its own ranks created.
std::string segment_stem(const std::string& nonce, const std::string& tag) {
  if (tag.empty()) return nonce;
  if (!is_segment_tag(tag))
    throw ConfigError(fmt::format("{}='{}' must be 1 to {} letters, digits, '-' or '_'; it is set by `lockstep run`, "
                                  "unset it when starting ranks otherwise",
                                  env::kShmTag, tag, kMaxSegmentTagLength));
  return tag + "." + nonce;
}

// What reading the clock twice costs with nothing between (the least of a
// few tries): taken off each timed load of a peer's line.
std::int64_t clock_cost_nanos() {
  std::int64_t least = std::numeric_limits<std::int64_t>::max();
  for (int i = 0; i < 64; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const auto end = std::chrono::steady_clock::now();
    least = std::min<std::int64_t>(least, std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
  }
  return least;
}

std::size_t slot_size(int n, std::size_t one_shot, std::size_t chunk) {
  const std::size_t need = std::max(one_shot, static_cast<std::size_t>(n) * chunk);
  return std::max<std::size_t>(4096, (need + 4095) / 4096 * 4096);
}

}  // namespace

ShmBackend::ShmBackend(const BackendContext& ctx)
    : rank_(ctx.rank),
      size_(ctx.size),
      self_(fmt::format("rank {}/{}", ctx.rank, ctx.size)),
      store_(ctx.store),
      os_(*ctx.os),
      log_(ctx.log),
      streaming_stores_(ctx.config.shm_streaming_stores),
      clock_cost_nanos_(clock_cost_nanos()),
      one_shot_max_(ctx.config.shm_one_shot_bytes.value_or(default_one_shot_bytes(ctx.size))),
      chunk_bytes_(std::max<std::size_t>(64, ctx.config.shm_chunk_bytes.value_or(kDefaultChunkBytes) / 64 * 64)),
      layout_(ctx.size, slot_size(ctx.size, one_shot_max_, chunk_bytes_)),
      base_(static_cast<std::size_t>(ctx.size), nullptr),
      waiter_(watch_, SpinPolicy::spin, self_),
      p2p_chunks_sent_(static_cast<std::size_t>(ctx.size), 0),
      p2p_chunks_received_(static_cast<std::size_t>(ctx.size), 0),
      sources_(static_cast<std::size_t>(ctx.size), nullptr) {
  if (size_ == 1) return;
  sweep_stale_regions();
  Store& store = *ctx.store;
  if (rank_ == 0) store.set("shm/nonce", random_hex(6));
  nonce_ = segment_stem(store.get("shm/nonce"), ctx.config.shm_tag);

  store.set(fmt::format("shm/rank/{}", rank_),
            fmt::format("{} {} {} {}", ::getpid(), pid_namespace(), affinity_mask(), nonce_));
  std::vector<pid_t> pids(static_cast<std::size_t>(size_), 0);
  std::vector<std::string> namespaces(static_cast<std::size_t>(size_));
  std::vector<std::string> masks(static_cast<std::size_t>(size_));
  stems_.resize(static_cast<std::size_t>(size_));
  for (int q = 0; q < size_; ++q) {
    std::istringstream info(store.get(fmt::format("shm/rank/{}", q)));
    info >> pids[static_cast<std::size_t>(q)] >> namespaces[static_cast<std::size_t>(q)] >>
        masks[static_cast<std::size_t>(q)] >> stems_[static_cast<std::size_t>(q)];
  }
  const RegionSharing sharing{&store, rank_, size_, pids, nonce_, ctx.connect_timeout, &os_};
  SharedRegions shared = share_regions(sharing, "shm/region", fmt::format("r{}", rank_), layout_.total,
                                       [this](std::byte* region) { init_control_block(region); });
  if (!shared.why_named.empty())
    log_.warn("shm: ranks cannot open each other's shared memory through /proc ({}); it goes through named files "
              "in /dev/shm until every rank has mapped them, which a rank killed meanwhile leaves behind (the "
              "launcher, or the next job, removes them)",
              shared.why_named);
  peer_regions_ = std::move(shared.regions);
  own_ = std::move(peer_regions_[static_cast<std::size_t>(rank_)]);
  base_[static_cast<std::size_t>(rank_)] = own_.data();
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    base_[static_cast<std::size_t>(q)] = peer_regions_[static_cast<std::size_t>(q)].data();
    if (control(q).magic != kMagic || control(q).rank != q)
      throw ConfigError(fmt::format("{}: rank {}'s shared region is not set up as expected; are two jobs using "
                                    "the same store?",
                                    self_, q));
  }
  region_sharing_ = sharing;
  pids_ = pids;
  // The same setting on every rank (it comes from the launcher's
  // environment), so every rank takes the same path.
  if (ctx.config.shm_single_copy_bytes) single_copy_bytes_ = *ctx.config.shm_single_copy_bytes;
  // Single copy only if every rank can read every peer (decided alike on
  // all ranks from everyone's probe).
  const std::string refused = probe_single_copy();
  store.set(fmt::format("shm/single_copy/{}", rank_), refused.empty() ? "1" : "0 " + refused);
  std::string first_refusal;
  for (int q = 0; q < size_ && first_refusal.empty(); ++q)
    if (const std::string answer = store.get(fmt::format("shm/single_copy/{}", q)); answer != "1")
      first_refusal = fmt::format("rank {}: {}", q, answer.substr(std::min<std::size_t>(2, answer.size())));
  single_copy_ = first_refusal.empty();
  // Once per group, by one rank: every rank knows the same.
  if (!single_copy_ && rank_ == 0)
    log_.info("shm: no single copy ({}); large blocks go through the shared slots (two copies)", first_refusal);
  // Which way ordinary buffers take (ordinary_paths.h): the same on every
  // rank, and single copy only where possible.
  const auto asked = static_cast<int>(ctx.config.shm_ordinary_path);
  store.set(fmt::format("shm/ordinary_path/{}", rank_), std::to_string(asked));
  bool alike = true;
  for (int q = 0; q < size_; ++q)
    alike = alike && store.get(fmt::format("shm/ordinary_path/{}", q)) == std::to_string(asked);
  if (!alike && rank_ == 0)
    log_.warn("shm: the ranks were given different {}; ordinary buffers go through the slots", env::kShmOrdinaryPath);
  ordinary_path_ = single_copy_ && alike ? ctx.config.shm_ordinary_path : ShmOrdinaryPath::slots;
  watch_ = PeerWatch(pids, namespaces, rank_);
  std::vector<const std::atomic<std::uint32_t>*> departed(static_cast<std::size_t>(size_), nullptr);
  for (int q = 0; q < size_; ++q)
    if (q != rank_) departed[static_cast<std::size_t>(q)] = &control(q).departed;
  watch_.watch_departures(std::move(departed));
  const bool crowded = oversubscribed(masks);
  waiter_ = Waiter(watch_, crowded ? SpinPolicy::yield : SpinPolicy::spin, self_, spin_budget(ctx.config));
  log_.debug("shm: {} ranks mapped, {} KiB per region, slots of {} KiB, one-shot up to {} B, chunks of {} B, {}, "
             "single copy {}, streaming stores {}",
             size_, layout_.total / 1024, layout_.slot_bytes / 1024, one_shot_max_, chunk_bytes_,
             wait_policy(crowded, waiter_.budget()),
             !single_copy_                                      ? "off"
             : ordinary_path_ == ShmOrdinaryPath::single_copy  ? "on (ordinary buffers of all-reduces and broadcasts too)"
             : ordinary_path_ == ShmOrdinaryPath::automatic    ? "on (ordinary buffers of all-reduces and broadcasts where it measures cheaper)"
                                                               : "on",
             streaming_stores_ == ShmStreamingStores::automatic ? "while peers are far"
             : streaming_stores_ == ShmStreamingStores::always  ? "always"
                                                                : "never");
}

ShmBackend::~ShmBackend() = default;

// Before any peer can see the region: the magic number last, released.
void ShmBackend::init_control_block(std::byte* region) const {
  auto* block = new (region) ControlBlock();
  block->owner_pid = ::getpid();
  block->rank = rank_;
  block->owner_address = reinterpret_cast<std::uint64_t>(region);
  for (int i = 0; i < 2 * size_; ++i) new (region + layout_.p2p_counters + i * sizeof(Counter)) Counter();
  std::atomic_thread_fence(std::memory_order_release);
  block->magic = kMagic;
}

std::string ShmBackend::probe_single_copy() const {
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    std::uint64_t magic = 0;
    const auto* remote = reinterpret_cast<const void*>(control(q).owner_address);
    const std::string why = read_peer(pids_[static_cast<std::size_t>(q)], &magic, remote, sizeof magic);
    if (!why.empty()) return fmt::format("cannot read rank {}'s memory: {}", q, why);
    if (magic != kMagic) return fmt::format("reading rank {}'s memory gave something else", q);
  }
  return "";
}

void ShmBackend::write_peer_or_throw(const OpContext& op, int q, void* remote, const void* local,
                                     std::size_t bytes) const {
  throw_if_failed(op, q, "write", write_peer(pids_[static_cast<std::size_t>(q)], remote, local, bytes));
}

void ShmBackend::read_peer_or_throw(const OpContext& op, int q, void* local, const void* remote,
                                    std::size_t bytes) const {
  throw_if_failed(op, q, "read", read_peer(pids_[static_cast<std::size_t>(q)], local, remote, bytes));
}

void ShmBackend::throw_if_failed(const OpContext& op, int q, const char* verb, const std::string& why) const {
  if (!why.empty())
    throw PeerError(fmt::format("{}: {}: could not {} rank {}'s buffer ({}); it worked at set-up, so rank {} has "
                                "probably exited",
                                self_, op.description(), verb, q, why, q),
                    q);
}

// The address goes in this rank's slot of the round, so it carries the
// round's stamp like any data: a peer in another operation fails the check
// before it reads anything.
void ShmBackend::single_copy_round(const OpContext& op, const void* mine, bool read_everyone, int only_from,
                                   const std::function<void(int q, const std::byte* theirs)>& read_from) {
  const std::uint64_t g = begin_round(op);
  const auto address = reinterpret_cast<std::uint64_t>(mine);
  std::memcpy(slot(rank_, g), &address, sizeof address);
  post_arrive(g, op);
  for (int i = 1; i < size_; ++i) {
    const int q = (rank_ + i) % size_;
    if (!read_everyone && q != only_from) continue;
    wait_arrived(q, g, op, "its buffer's address");
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, slot(q, g), sizeof theirs);
    read_from(q, reinterpret_cast<const std::byte*>(theirs));
  }
  control(rank_).consumed.post(g + 1);
  // The caller may change its buffer once this returns: wait until every
  // peer is done reading it.
  wait_all(&ControlBlock::consumed, g + 1, op, "to finish reading this rank's buffer");
}

// Each rank creates its copy and maps everyone's (region_sharing.h): the
// same steps as set-up.
std::shared_ptr<std::byte[]> ShmBackend::allocate_shared(std::size_t bytes, Deadline deadline) {
  if (size_ == 1) return Backend::allocate_shared(bytes, deadline);
  std::lock_guard lock(allocate_mutex_);
  const std::uint64_t id = allocations_made_.load();
  const std::size_t rounded = std::max<std::size_t>(4096, (bytes + 4095) / 4096 * 4096);
  RegionSharing sharing = region_sharing_;
  sharing.timeout = deadline.remaining();
  SharedRegions shared = share_regions(sharing, fmt::format("shm/alloc/{}", id), fmt::format("a{}r{}", id, rank_),
                                       rounded, [](std::byte*) {});
  std::byte* mine = shared.regions[static_cast<std::size_t>(rank_)].data();
  allocations_->add(id, rounded, rank_, std::move(shared.regions));
  allocations_made_.store(id + 1);
  // The deleter keeps the registry alive, so the memory may outlive the group.
  return std::shared_ptr<std::byte[]>(mine, [registry = allocations_, id](std::byte*) { registry->remove(id); });
}

void ShmBackend::shutdown(Deadline) {
  // Shared memory outlives any one mapping, so a peer still reading this
  // rank's region is unaffected by its exit; the flag only tells a peer
  // still waiting for this rank that it left on purpose.
  if (size_ > 1 && own_.data() != nullptr) control(rank_).departed.store(1, std::memory_order_release);
}

Counter& ShmBackend::p2p_sent(int q, int to) const {
  return *reinterpret_cast<Counter*>(base_[static_cast<std::size_t>(q)] + layout_.p2p_counters +
                                     static_cast<std::size_t>(to) * sizeof(Counter));
}

Counter& ShmBackend::p2p_received(int q, int from) const {
  return *reinterpret_cast<Counter*>(base_[static_cast<std::size_t>(q)] + layout_.p2p_counters +
                                     static_cast<std::size_t>(size_ + from) * sizeof(Counter));
}

std::byte* ShmBackend::mailbox(int q, int to, std::uint64_t chunk) const {
  return base_[static_cast<std::size_t>(q)] + layout_.mailboxes +
         (static_cast<std::size_t>(to) * 2 + chunk % 2) * kMailboxBytes;
}

std::uint64_t ShmBackend::begin_round(const OpContext& op) {
  const std::uint64_t g = rounds_++;
  if (g >= kSlots) wait_all(&ControlBlock::consumed, g - kSlots + 1, op, "to release a shared slot");
  return g;
}

void ShmBackend::wait_all(Counter ControlBlock::*counter, std::uint64_t target, const OpContext& op,
                          const char* what) const {
  for (int q = 0; q < size_; ++q)
    if (q != rank_) waiter_.wait_at_least(control(q).*counter, target, q, op, what, &peer_began_a_small_operation_);
}

void ShmBackend::wait_one(int q, Counter ControlBlock::*counter, std::uint64_t target, const OpContext& op,
                          const char* what) const {
  waiter_.wait_at_least(control(q).*counter, target, q, op, what, &peer_began_a_small_operation_);
}

void ShmBackend::wait_arrived(int q, std::uint64_t g, const OpContext& op, const char* what) const {
  waiter_.wait_at_least(control(q).arrive, g + 1, q, op, what, &peer_began_a_small_operation_);
  // Only `auto` uses the samples.
  if (streaming_stores_ == ShmStreamingStores::automatic && g % kDistanceEvery == 0) sample_peer_distance(q);
  // A peer up to kSlots rounds ahead may have re-stamped the line: then
  // another wait of this operation, or the peer itself, does the check.
  if (const auto stamp = control(q).arrive.stamp_of(g + 1)) check_round_stamp(op, stamp->first, stamp->second, q, self_);
}

// The peer wrote its probe line just before posting round g, so the line is
// modified in its cache (or its die's), and the load is a transfer from
// there: what every line of its slot costs this rank. Only the time is
// used; a peer that has since moved on has written a later round, as near.
void ShmBackend::sample_peer_distance(int q) const {
  const auto& line = control(q).distance_probe.value;
  const auto start = std::chrono::steady_clock::now();
  const std::uint64_t seen = line.load(std::memory_order_relaxed);
  const auto end = std::chrono::steady_clock::now();
  asm volatile("" : : "r"(seen));
  const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count() - clock_cost_nanos_;
  if (peer_distance_.record(nanos) && streaming_stores_ == ShmStreamingStores::automatic)
    log_.debug("shm: a line peers have just written now loads in {} ns (median): {}", peer_distance_.median(),
               peer_distance_.far() ? "far, slots written with streaming stores" : "near, slots written as usual");
}

void ShmBackend::wait_arrived_all(std::uint64_t g, const OpContext& op, const char* what) const {
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_arrived(q, g, op, what);
}

std::uint64_t ShmBackend::post_inline(const void* payload, std::size_t bytes, const OpContext& op) {
  const std::uint64_t seq = ++inline_ops_;
  // Line seq % 2 last carried operation seq - 2; every peer has read it
  // once it has posted seq - 1.
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_inline(q, seq - 1, op, "its arrival at the previous small operation", /*check=*/false);
  InlineLine& line = control(rank_).lines[seq % 2];
  // Word copies: a library memcpy call costs more than these few bytes.
  const auto* in = static_cast<const unsigned char*>(payload);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) __builtin_memcpy(line.payload + i, in + i, 8);
  for (; i < bytes; ++i) line.payload[i] = in[i];
  line.stamp.store(inline_stamp(op.info), std::memory_order_relaxed);
  line.seq.store(seq, std::memory_order_seq_cst);
  if (line.sleepers.load(std::memory_order_seq_cst) != 0) wake_all(line.seq, control(rank_).lines_woke_at);
  return seq;
}

void ShmBackend::wait_inline(int q, std::uint64_t seq, const OpContext& op, const char* what, bool check) const {
  if (seq == 0) return;
  InlineLine& line = control(q).lines[seq % 2];
  waiter_.wait_at_least(line.seq, line.sleepers, control(q).lines_woke_at, seq, q, op, what, &peer_began_a_round_);
  if (check) check_inline_stamp(op, line.stamp.load(std::memory_order_relaxed), q, self_);
}

// This rank waits in a small operation, so every round it began is behind
// it; a peer that has posted the arrival of a later round without having
// reached this small operation is in a collective this rank did not issue.
// A peer may also have posted this operation's line since the wait last
// looked, finished it and begun a round: its line, posted before that
// round's arrival (so seen after the acquire), says so, and that is no
// mismatch.
void ShmBackend::PeerBeganARound::check(int peer, const OpContext& op) const {
  const Counter& arrive = shm_.control(peer).arrive;
  const std::uint64_t posted = arrive.value.load(std::memory_order_acquire);
  if (posted <= shm_.rounds_) return;
  const std::uint64_t current = shm_.inline_ops_;
  if (shm_.control(peer).lines[current % 2].seq.load(std::memory_order_acquire) >= current) return;
  // Unreadable only while the peer rewrites it; the next check reads it.
  if (const auto stamp = arrive.stamp_of(posted)) check_round_stamp(op, stamp->first, stamp->second, peer, shm_.self_);
}

// This rank waits in a round; a small operation a peer posted beyond this
// rank's count, while the peer has not arrived at this rank's latest
// round, is one this rank did not issue. A peer that has arrived there
// (its arrival was posted before the line, so it is seen after the
// acquire) may have finished the collective and moved on: no mismatch.
void ShmBackend::PeerBeganASmallOperation::check(int peer, const OpContext& op) const {
  const std::uint64_t next = shm_.inline_ops_ + 1;
  const InlineLine& line = shm_.control(peer).lines[next % 2];
  if (line.seq.load(std::memory_order_acquire) < next) return;
  if (shm_.control(peer).arrive.value.load(std::memory_order_acquire) >= shm_.rounds_) return;
  check_inline_stamp(op, line.stamp.load(std::memory_order_relaxed), peer, shm_.self_);
}

void ShmBackend::barrier(const OpContext& op) {
  if (size_ == 1) return;
  const std::uint64_t seq = post_inline(nullptr, 0, op);
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_inline(q, seq, op, "its arrival at the barrier");
}

}  // namespace lockstep::shm

namespace lockstep {

std::unique_ptr<Backend> make_shm_backend(const BackendContext& ctx) { return std::make_unique<shm::ShmBackend>(ctx); }

}  // namespace lockstep
