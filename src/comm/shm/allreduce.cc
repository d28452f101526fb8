// shm allreduce: inline, one-shot or pipelined two-shot by size (see
// shm_backend.h). reduce_two_shot also serves reduce.
#include <algorithm>
#include <array>
#include <cstring>

#include <sys/mman.h>

#include <fmt/format.h>

#include "comm/reduce_kernels.h"
#include "comm/shm/shm_backend.h"
#include "comm/chunks.h"

namespace lockstep::shm {

void ShmBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  allreduce_into(op, data, data, reduce_op);
}

void ShmBackend::allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  const bool large = output.bytes() > kInlineBytes && output.bytes() > one_shot_max_;
  if (size_ > 1 && large) {
    if (auto shared = agree_on_shared_buffers(op, input, output)) {
      const auto starts = [&](SharedAllocations::Location at) {
        std::vector<std::byte*> out = allocations_->bases(at.id);
        for (std::byte*& p : out) p += at.offset;
        return out;
      };
      allreduce_shared(op, output.count, output.dtype, reduce_op, starts(shared->first), starts(shared->second));
      return;
    }
    // The same condition on every rank: each answers, adopted or not.
    if (adopt_buffers_ && output.bytes() >= AdoptedBuffers::kMinBytes &&
        allreduce_adopted(op, output, input.data == output.data, reduce_op))
      return;
  }
  if (input.data != output.data && output.count > 0) std::memcpy(output.data, input.data, output.bytes());
  allreduce_ordinary(op, output, reduce_op);
}

void ShmBackend::allreduce_ordinary(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  if (size_ == 1 || data.count == 0) return;
  if (data.bytes() <= kInlineBytes)
    allreduce_inline(op, data, reduce_op);
  else if (data.bytes() <= one_shot_max_)
    allreduce_one_shot(op, data, reduce_op);
  else
    reduce_two_shot(op, data, reduce_op, /*gather_to=*/-1);
}

namespace {

// Whether an answer read from a peer's line describes an adoption of a
// buffer of `bytes`. A peer that issued another operation here left
// something else in its line; the rounds that follow report that
// divergence, as long as nothing here acts on what it left.
bool plausible(const AdoptionAnswer& a, std::size_t bytes) {
  constexpr std::int64_t kPage = 4096;
  return (a.adopted == 1 || a.adopted == 2) && a.generation >= 0 && a.slot >= 0 &&
         a.slot < static_cast<std::int64_t>(AdoptedBuffers::kSlots) && a.head_bytes >= 0 && a.head_bytes < kPage &&
         a.interior_bytes > 0 && a.interior_bytes % kPage == 0 &&
         a.head_bytes + a.interior_bytes <= static_cast<std::int64_t>(bytes);
}

}  // namespace

// Every rank answers whether its buffer's interior pages are adopted
// (adopted_buffers.h); only if all are, the elements inside every rank's
// interior go through allreduce_shared, reading the peers' pages through
// this rank's views of them, and the edges (under a page on each side, at
// most, on the rank with the most) through the ordinary path. Each
// element is still reduced once, in rank order: the result is the
// ordinary path's, bit for bit.
bool ShmBackend::allreduce_adopted(const OpContext& op, Buffer data, bool in_place, ReduceOp reduce_op) {
  const std::size_t elem = dtype_size(data.dtype);
  const std::size_t adopted_before = adopted_->adoptions();
  const AdoptionAnswer mine = adopted_->answer(static_cast<std::byte*>(data.data), data.bytes(), elem, in_place);
  if (adopted_->adoptions() != adopted_before)
    log_.debug("shm: adopted {} KiB of a {} KiB buffer at {} into shared memory in place (all-reduced in place a "
               "second time); peers read it there from now on",
               mine.interior_bytes / 1024, data.bytes() / 1024, data.data);
  if (!adopted_->last_refusal().empty())
    log_.debug("shm: not adopting the {} KiB buffer at {} into shared memory: {}", data.bytes() / 1024, data.data,
               adopted_->last_refusal());
  std::vector<AdoptionAnswer> answers(static_cast<std::size_t>(size_));
  exchange_inline(op, &mine, sizeof mine, "its answer on whether its buffer is adopted, before a large all-reduce",
                  answers.data());
  const bool all_adopted =
      std::all_of(answers.begin(), answers.end(), [&](const AdoptionAnswer& a) { return plausible(a, data.bytes()); });
  if (!all_adopted) return false;
  std::size_t head = 0, tail = 0;  // elements outside some rank's interior
  for (const AdoptionAnswer& a : answers) {
    head = std::max(head, static_cast<std::size_t>(a.head_bytes) / elem);
    tail = std::max(tail, (data.bytes() - static_cast<std::size_t>(a.head_bytes + a.interior_bytes)) / elem);
  }
  if (head + tail >= data.count) return false;
  std::vector<std::byte*> starts(static_cast<std::size_t>(size_));
  const bool fresh = std::any_of(answers.begin(), answers.end(), [](const AdoptionAnswer& a) { return a.adopted == 2; });
  bool mapped = true;
  try {
    for (int q = 0; q < size_; ++q) {
      const AdoptionAnswer& a = answers[static_cast<std::size_t>(q)];
      std::byte* interior = q == rank_ ? static_cast<std::byte*>(data.data) + a.head_bytes : peer_view(q, a);
      starts[static_cast<std::size_t>(q)] = interior + (head * elem - static_cast<std::size_t>(a.head_bytes));
    }
  } catch (const Error& e) {
    if (!fresh) throw;  // every view was mapped before: cannot fail here
    // Once per group: the same buffer fails the same way every step.
    if (!warned_unmappable_)
      log_.warn("shm: cannot map a peer's adopted buffer ({}); such all-reduces go through the slots", e.what());
    warned_unmappable_ = true;
    mapped = false;
  }
  // A new adoption: every rank says whether it could map it, so that all
  // take the same path.
  if (fresh && !agree_all(op, mapped, "whether it mapped its peers' adopted buffers")) return false;
  auto* bytes = static_cast<std::byte*>(data.data);
  if (head > 0) allreduce_ordinary(op, Buffer{bytes, head, data.dtype}, reduce_op);
  allreduce_shared(op, data.count - head - tail, data.dtype, reduce_op, starts, starts);
  // Every peer has mapped this rank's file (it arrived in the rounds above).
  adopted_->peers_mapped(mine);
  if (tail > 0) allreduce_ordinary(op, Buffer{bytes + (data.count - tail) * elem, tail, data.dtype}, reduce_op);
  return true;
}

bool ShmBackend::agree_all(const OpContext& op, bool mine, const char* what) {
  const std::int64_t answer = mine ? 1 : 0;
  std::vector<std::int64_t> answers(static_cast<std::size_t>(size_));
  exchange_inline(op, &answer, sizeof answer, what, answers.data());
  return std::all_of(answers.begin(), answers.end(), [](std::int64_t a) { return a == 1; });
}

void ShmBackend::exchange_inline(const OpContext& op, const void* mine, std::size_t bytes, const char* what,
                                 void* every_rank) {
  const std::uint64_t seq = post_inline(mine, bytes, op);
  auto* out = static_cast<std::byte*>(every_rank);
  for (int q = 0; q < size_; ++q) {
    // Unchecked: the rounds that follow carry the check.
    if (q != rank_) wait_inline(q, seq, op, what, /*check=*/false);
    std::memcpy(out + static_cast<std::size_t>(q) * bytes, q == rank_ ? mine : inline_payload(q, seq), bytes);
  }
}

std::string ShmBackend::adoption_name(int q, std::int64_t generation) const {
  // The rank too: ranks that are threads of one process share a pid.
  return region_name_of(stems_[static_cast<std::size_t>(q)], fmt::format("adopt-{}r{}", generation, q),
                        pids_[static_cast<std::size_t>(q)]);
}

std::byte* ShmBackend::peer_view(int q, const AdoptionAnswer& answer) {
  PeerView& view = peer_views_[static_cast<std::size_t>(q)][static_cast<std::size_t>(answer.slot)];
  if (view.generation != answer.generation) {
    view.region = Region::open(adoption_name(q, answer.generation), static_cast<std::size_t>(answer.interior_bytes), os_);
    // Not this process's memory to hand to a forked child.
    ::madvise(view.region.data(), view.region.bytes(), MADV_DONTFORK);
    view.generation = answer.generation;
  }
  return view.region.data();
}

std::optional<std::pair<SharedAllocations::Location, SharedAllocations::Location>> ShmBackend::agree_on_shared_buffers(
    const OpContext& op, ConstBuffer input, ConstBuffer output) {
  // No shared allocation was ever made (the same answer on every rank):
  // skip the exchange.
  if (allocations_made_.load() == 0) return std::nullopt;
  const auto in = allocations_->find(input.data, input.bytes());
  const auto out = allocations_->find(output.data, output.bytes());
  const auto id = [](const auto& at) { return at ? static_cast<std::int64_t>(at->id) : -1; };
  const auto offset = [](const auto& at) { return at ? static_cast<std::int64_t>(at->offset) : -1; };
  const std::array<std::int64_t, 4> descriptor = {id(in), offset(in), id(out), offset(out)};
  std::vector<std::array<std::int64_t, 4>> all(static_cast<std::size_t>(size_));
  exchange_inline(op, &descriptor, sizeof descriptor,
                  "its answer on whether the buffers are shared buffers, agreed before a large all-reduce", all.data());
  const bool all_same = in.has_value() && out.has_value() &&
                        std::all_of(all.begin(), all.end(), [&](const auto& theirs) { return theirs == descriptor; });
  if (!all_same) return std::nullopt;
  return std::pair{*in, *out};
}

// The two-shot rounds without the slots: arrive means "my input is ready";
// the owner of each chunk reduces it from every rank's input straight into
// its own output, then writes the result into every peer's output itself
// (push, not pull). In place, that is memory the owner has just read: its
// lines are already in the owner's cache, where a peer copying the result
// in (pull) writes lines that sit in the owner's cache and must be taken
// back first; pushed, an in-place 64 MiB all-reduce runs at 1.7x the pulled
// rate on 2 ranks, and out of place is unchanged (docs/algorithms.md).
// Once every owner has said it is done (reduced), no peer touches this
// rank's buffers any more: the caller may overwrite them at once.
void ShmBackend::allreduce_shared(const OpContext& op, std::size_t count, DType dtype, ReduceOp reduce_op,
                                  const std::vector<std::byte*>& input, const std::vector<std::byte*>& output) {
  const std::size_t elem = dtype_size(dtype);
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes_ / elem);
  const std::size_t round_elems = chunk_elems * static_cast<std::size_t>(size_);
  for (std::size_t begin = 0; begin < count; begin += round_elems) {
    const Chunks chunks(std::min(round_elems, count - begin), size_);
    const auto at = [&](const std::vector<std::byte*>& starts, int q, int c) {
      return starts[static_cast<std::size_t>(q)] + (begin + chunks.begin(c)) * elem;
    };
    const auto in = [&](int q, int c) { return at(input, q, c); };
    const auto out = [&](int q, int c) { return at(output, q, c); };
    const std::uint64_t g = begin_round(op);
    post_arrive(g, op);
    wait_arrived_all(g, op, "its input");
    for (int q = 0; q < size_; ++q) sources_[static_cast<std::size_t>(q)] = in(q, rank_);
    reduce_many(out(rank_, rank_), sources_.data(), size_, chunks.size(rank_), dtype, reduce_op);
    for (int q = 0; q < size_; ++q)
      if (q != rank_) std::memcpy(out(q, rank_), out(rank_, rank_), chunks.size(rank_) * elem);
    control(rank_).reduced.post(g + 1);
    for (int q = 0; q < size_; ++q)
      if (q != rank_) wait_one(q, &ControlBlock::reduced, g + 1, op, "its reduced chunk");
    // Every rank posts consumed for every round (the slots' invariant).
    control(rank_).consumed.post(g + 1);
  }
}

void ShmBackend::allreduce_inline(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  const std::uint64_t seq = post_inline(data.data, data.bytes(), op);
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) wait_inline(q, seq, op, "its part of a small operation");
    sources_[static_cast<std::size_t>(q)] = inline_payload(q, seq);
  }
  reduce_many(data.data, sources_.data(), size_, data.count, data.dtype, reduce_op);
}

void ShmBackend::allreduce_one_shot(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  const std::uint64_t g = begin_round(op);
  to_slot(slot(rank_, g), data.data, data.bytes());
  post_arrive(g, op);
  wait_arrived_all(g, op, "its input");
  for (int q = 0; q < size_; ++q) sources_[static_cast<std::size_t>(q)] = q == rank_ ? data.data : slot(q, g);
  reduce_many(data.data, sources_.data(), size_, data.count, data.dtype, reduce_op);
  control(rank_).consumed.post(g + 1);
}
// Rounds of size x chunk bytes. In each: copy the chunks others own into
// this rank's slot; reduce the chunk this rank owns from everyone (its own
// from its buffer) and put the result in its slot; then gather each
// owner's reduced chunk.
void ShmBackend::reduce_two_shot(const OpContext& op, Buffer data, ReduceOp reduce_op, int gather_to) {
  const std::size_t elem = dtype_size(data.dtype);
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes_ / elem);
  const std::size_t round_elems = chunk_elems * static_cast<std::size_t>(size_);
  auto* buf = static_cast<std::byte*>(data.data);
  const bool gather_here = gather_to < 0 || gather_to == rank_;
  for (std::size_t begin = 0; begin < data.count; begin += round_elems) {
    const std::size_t count = std::min(round_elems, data.count - begin);
    const Chunks chunks(count, size_);
    const auto in_buffer = [&](int c) { return buf + (begin + chunks.begin(c)) * elem; };
    const auto in_slot = [&](int q, std::uint64_t g, int c) { return slot(q, g) + static_cast<std::size_t>(c) * chunk_bytes_; };

    const std::uint64_t g = begin_round(op);
    for (int c = 0; c < size_; ++c)
      if (c != rank_) to_slot(in_slot(rank_, g, c), in_buffer(c), chunks.size(c) * elem);
    post_arrive(g, op);
    wait_arrived_all(g, op, "its input");

    for (int q = 0; q < size_; ++q)
      sources_[static_cast<std::size_t>(q)] = q == rank_ ? in_buffer(rank_) : in_slot(q, g, rank_);
    std::byte* mine = in_slot(rank_, g, rank_);
    const std::size_t mine_bytes = chunks.size(rank_) * elem;
    if (gather_here) {
      // Into this rank's buffer, where the result belongs; an all-reduce's
      // peers get it through the slot, copied with streaming stores
      // (handoff_copy.h) rather than read from this core's cache.
      reduce_many(in_buffer(rank_), sources_.data(), size_, chunks.size(rank_), data.dtype, reduce_op);
      if (gather_to < 0) to_slot(mine, in_buffer(rank_), mine_bytes);
    } else {
      // A reduce's other ranks keep their buffers: the result goes to the slot.
      reduce_many(mine, sources_.data(), size_, chunks.size(rank_), data.dtype, reduce_op);
    }
    control(rank_).reduced.post(g + 1);
    if (gather_here) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        wait_one(q, &ControlBlock::reduced, g + 1, op, "its reduced chunk");
        std::memcpy(in_buffer(q), in_slot(q, g, q), chunks.size(q) * elem);
      }
    }
    control(rank_).consumed.post(g + 1);
  }
}

}  // namespace lockstep::shm
