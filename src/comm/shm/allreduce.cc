// shm allreduce: inline, one-shot or pipelined two-shot by size (see
// shm_backend.h). reduce_two_shot also serves reduce.
#include <algorithm>
#include <cstring>

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
      allreduce_shared(op, output.count, output.dtype, reduce_op, shared->first, shared->second);
      return;
    }
  }
  if (input.data != output.data && output.count > 0) std::memcpy(output.data, input.data, output.bytes());
  if (size_ == 1 || output.count == 0) return;
  if (output.bytes() <= kInlineBytes)
    allreduce_inline(op, output, reduce_op);
  else if (output.bytes() <= one_shot_max_)
    allreduce_one_shot(op, output, reduce_op);
  else
    reduce_two_shot(op, output, reduce_op, /*gather_to=*/-1);
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
  const std::int64_t descriptor[4] = {id(in), offset(in), id(out), offset(out)};
  const std::uint64_t seq = post_inline(descriptor, sizeof descriptor, op);
  bool all_same = in.has_value() && out.has_value();
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    // The rounds that follow carry the check.
    wait_inline(q, seq, op, "its answer on whether the buffers are shared buffers, agreed before a large all-reduce",
                /*check=*/false);
    all_same = all_same && std::memcmp(inline_payload(q, seq), descriptor, sizeof descriptor) == 0;
  }
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
                                  SharedAllocations::Location input, SharedAllocations::Location output) {
  const std::vector<std::byte*> in_bases = allocations_->bases(input.id);
  const std::vector<std::byte*> out_bases = allocations_->bases(output.id);
  const std::size_t elem = dtype_size(dtype);
  const std::size_t chunk_elems = std::max<std::size_t>(1, chunk_bytes_ / elem);
  const std::size_t round_elems = chunk_elems * static_cast<std::size_t>(size_);
  for (std::size_t begin = 0; begin < count; begin += round_elems) {
    const Chunks chunks(std::min(round_elems, count - begin), size_);
    const auto at = [&](const std::vector<std::byte*>& bases, std::size_t offset, int q, int c) {
      return bases[static_cast<std::size_t>(q)] + offset + (begin + chunks.begin(c)) * elem;
    };
    const auto in = [&](int q, int c) { return at(in_bases, input.offset, q, c); };
    const auto out = [&](int q, int c) { return at(out_bases, output.offset, q, c); };
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
