// See staging_area.h.
#include "comm/staging/staging_area.h"

#include <algorithm>

#include <fmt/format.h>

#include "comm/device_memory.h"

namespace lockstep::cuda {
namespace {

cudaStream_t stream_of(const OpContext& op) { return static_cast<cudaStream_t>(op.streams->stream()); }

void copy(void* to, const void* from, std::size_t bytes, cudaStream_t stream, const char* what) {
  if (bytes > 0) check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream), what);
}

std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Polls `event` until it completes: TimeoutError at the operation's
// deadline, OperationCancelled when the group aborts meanwhile.
void wait_within(const OpContext& op, const Event& event, std::string_view what) {
  if (wait_for(event, op.deadline, [&] { return op.cancelled(); })) return;
  if (op.cancelled()) throw OperationCancelled(fmt::format("{} was cancelled while {}", op.description(), what));
  throw TimeoutError(fmt::format("{} timed out after {:.1f} s {}: the device did not finish its work. A kernel "
                                 "queued before the collective on the same stream may be stuck; if the device "
                                 "is only busy, raise LOCKSTEP_TIMEOUT",
                                 op.description(), static_cast<double>(op.timeout.count()) / 1000.0, what));
}

}  // namespace

void StagingArea::reuse(const OpContext& op) {
  wait_within(op, released_, "waiting for the staging copies of the previous collective");
}

void StagingArea::pipelined(const OpContext& op, ConstBuffer in, Buffer out, bool copy_in, bool copy_out,
                            const ChunkRun& run) {
  const std::size_t element = dtype_size(out.dtype);
  const std::size_t chunk_count = std::max<std::size_t>(1, chunk_bytes_ / element);
  const std::size_t slot_bytes = round_up(chunk_count * element);
  const std::size_t chunks = (out.count + chunk_count - 1) / chunk_count;
  const cudaStream_t stream = stream_of(op);
  reuse(op);
  std::byte* const host = memory_.reserve(kSlots * slot_bytes);
  const auto first = [&](std::size_t i) { return i * chunk_count; };
  const auto count = [&](std::size_t i) { return std::min(chunk_count, out.count - first(i)); };
  const auto slot = [&](std::size_t i) { return host + (i % kSlots) * slot_bytes; };
  const auto queue_in = [&](std::size_t i) {
    // The slot's previous chunk must be back on the device first.
    if (i >= kSlots) check(cudaStreamWaitEvent(stream, returned_[i % kSlots].get(), 0), "ordering the staging copies");
    if (copy_in)
      copy(slot(i), static_cast<const std::byte*>(in.data) + first(i) * element, count(i) * element, stream,
           "copying a chunk of CUDA memory to the host");
    arrived_[i % kSlots].record(stream);
  };
  std::size_t queued = 0;
  for (std::size_t i = 0; i < chunks; ++i) {
    for (; queued < chunks && queued < i + kSlots; ++queued) queue_in(queued);
    wait_within(op, arrived_[i % kSlots], "copying CUDA memory to the host");
    OpContext chunk_op = op;
    chunk_op.info.count = count(i);
    run(chunk_op, Buffer{slot(i), count(i), out.dtype});
    // The host saw chunk i arrive, so everything the group's stream waited
    // for (the caller's work on `out`) is done: back_ needs no other order.
    if (copy_out)
      copy(static_cast<std::byte*>(out.data) + first(i) * element, slot(i), count(i) * element, back_.get(),
           "copying a chunk back to CUDA memory");
    returned_[i % kSlots].record(back_.get());
  }
  all_returned_.record(back_.get());
  check(cudaStreamWaitEvent(stream, all_returned_.get(), 0), "ordering the staging copies");
  released_.record(stream);
}

void StagingArea::whole(const OpContext& op, ConstBuffer in, Buffer out, const WholeRun& run) {
  const cudaStream_t stream = stream_of(op);
  reuse(op);
  std::byte* const host = memory_.reserve(round_up(in.bytes()) + round_up(out.bytes()) + 1);
  std::byte* const host_out = host + round_up(in.bytes());
  copy(host, in.data, in.bytes(), stream, "copying CUDA memory to the host");
  arrived_[0].record(stream);
  wait_within(op, arrived_[0], "copying CUDA memory to the host");
  run(ConstBuffer{in.count > 0 ? host : nullptr, in.count, in.dtype},
      Buffer{out.count > 0 ? host_out : nullptr, out.count, out.dtype});
  copy(out.data, host_out, out.bytes(), stream, "copying the result back to CUDA memory");
  released_.record(stream);
}

}  // namespace lockstep::cuda
