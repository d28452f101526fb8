// shm allreduce: inline, one-shot or pipelined two-shot by size (see
// shm_backend.h). reduce_two_shot also serves reduce.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>

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
    if (ordinary_path_ != ShmOrdinaryPath::slots) {
      run_ordinary(op, allreduce_paths_, output.bytes(), [&](OrdinaryPaths::Path path) {
        if (path == OrdinaryPaths::Path::single_copy) return allreduce_single_copy(op, input, output, reduce_op);
        if (input.data != output.data) std::memcpy(output.data, input.data, output.bytes());
        allreduce_ordinary(op, output, reduce_op);
      });
      return;
    }
  }
  if (input.data != output.data && output.count > 0) std::memcpy(output.data, input.data, output.bytes());
  allreduce_ordinary(op, output, reduce_op);
}

void ShmBackend::run_ordinary(const OpContext& op, PathChoice& choice, std::size_t bytes,
                              const std::function<void(OrdinaryPaths::Path)>& run) {
  if (ordinary_path_ != ShmOrdinaryPath::automatic) {
    run(ordinary_path_ == ShmOrdinaryPath::single_copy ? OrdinaryPaths::Path::single_copy : OrdinaryPaths::Path::slots);
    return;
  }
  const OrdinaryPaths::Path path = choose_path(op, choice, bytes);
  const auto start = std::chrono::steady_clock::now();
  run(path);
  const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  choice.costs.record(path, bytes, took.count());
}

OrdinaryPaths::Path ShmBackend::choose_path(const OpContext& op, PathChoice& choice, std::size_t bytes) {
  const std::uint64_t n = choice.chosen++;
  if (const auto forced = OrdinaryPaths::forced(n)) return *forced;
  const auto mine = static_cast<std::int64_t>(choice.costs.vote(bytes));
  std::vector<std::int64_t> votes(static_cast<std::size_t>(size_));
  exchange_inline(op, &mine, sizeof mine, "its vote on how to move a large buffer", votes.data());
  const OrdinaryPaths::Path path = OrdinaryPaths::decide(votes.data(), size_);
  if (path != choice.last)
    log_.debug("shm: {} of {} KiB go {} now (per byte, here: slots {:.3f} ns, single copy {:.3f} ns)", choice.what,
               bytes / 1024, path == OrdinaryPaths::Path::single_copy ? "by single copy" : "through the slots",
               choice.costs.cost_per_byte(OrdinaryPaths::Path::slots, bytes),
               choice.costs.cost_per_byte(OrdinaryPaths::Path::single_copy, bytes));
  choice.last = path;
  return path;
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

// Ordinary buffers by cross-memory attach (LOCKSTEP_SHM_ORDINARY_PATH),
// in one round: every rank posts its input's and output's addresses; the
// owner of each n-th of the elements reads the peers' inputs of it a piece
// at a time into scratch memory (chunk_bytes_ per peer, so the reduction
// reads them from this core's cache), reduces them with its own in rank
// order into its output, and writes the result into every peer's output;
// then each rank waits until every owner has said it is done, after which
// no peer reads or writes its buffers. Each element is reduced once, in
// rank order: the slots' result, bit for bit. Nothing of the caller's
// memory is mapped by anyone.
void ShmBackend::allreduce_single_copy(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  const std::size_t elem = dtype_size(output.dtype);
  const std::uint64_t g = begin_round(op);
  const std::array<std::uint64_t, 2> mine = {reinterpret_cast<std::uint64_t>(input.data),
                                             reinterpret_cast<std::uint64_t>(output.data)};
  std::memcpy(slot(rank_, g), mine.data(), sizeof mine);
  post_arrive(g, op);
  wait_arrived_all(g, op, "its buffers' addresses");
  std::vector<std::array<std::uint64_t, 2>> theirs(static_cast<std::size_t>(size_));
  for (int q = 0; q < size_; ++q) std::memcpy(theirs[static_cast<std::size_t>(q)].data(), slot(q, g), sizeof mine);

  const std::size_t piece = std::max<std::size_t>(1, chunk_bytes_ / elem);
  single_copy_scratch_.resize(static_cast<std::size_t>(size_) * piece * elem);
  const Chunks owned(output.count, size_);
  const std::size_t end = owned.begin(rank_) + owned.size(rank_);
  const auto* in = static_cast<const std::byte*>(input.data);
  auto* out = static_cast<std::byte*>(output.data);
  for (std::size_t begin = owned.begin(rank_); begin < end; begin += piece) {
    const std::size_t count = std::min(piece, end - begin), bytes = count * elem, at = begin * elem;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        sources_[static_cast<std::size_t>(q)] = in + at;
        continue;
      }
      std::byte* scratch = single_copy_scratch_.data() + static_cast<std::size_t>(q) * piece * elem;
      read_peer_or_throw(op, q, scratch, reinterpret_cast<const std::byte*>(theirs[static_cast<std::size_t>(q)][0]) + at,
                         bytes);
      sources_[static_cast<std::size_t>(q)] = scratch;
    }
    reduce_many(out + at, sources_.data(), size_, count, output.dtype, reduce_op);
    for (int q = 0; q < size_; ++q)
      if (q != rank_)
        write_peer_or_throw(op, q, reinterpret_cast<std::byte*>(theirs[static_cast<std::size_t>(q)][1]) + at, out + at,
                            bytes);
  }
  control(rank_).reduced.post(g + 1);
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_one(q, &ControlBlock::reduced, g + 1, op, "its part of the result");
  control(rank_).consumed.post(g + 1);
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
