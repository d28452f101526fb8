// See staged_backend.h.
#include "comm/staging/staged_backend.h"

#include "comm/device_memory.h"

namespace lockstep::cuda {
namespace {

int device_of(const OpContext& op) { return op.streams->device().index; }

}  // namespace

StagedBackend::StagedBackend(Backend& host, int rank, std::size_t chunk_bytes)
    : host_(host), rank_(rank), chunk_bytes_(chunk_bytes) {}

StagingArea& StagedBackend::area(const OpContext& op) {
  auto& slot = areas_[device_of(op)];
  // Made with the device current (the callers' guard): its events belong to
  // the device whose stream records them.
  if (!slot) slot = std::make_unique<StagingArea>(chunk_bytes_);
  return *slot;
}

void StagedBackend::allreduce(const OpContext& op, Buffer data, ReduceOp reduce_op) {
  DeviceGuard guard(device_of(op));
  area(op).pipelined(op, data, data, true, true,
                     [&](const OpContext& chunk_op, Buffer chunk) { host_.allreduce(chunk_op, chunk, reduce_op); });
}

void StagedBackend::allreduce_into(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  DeviceGuard guard(device_of(op));
  area(op).pipelined(op, input, output, true, true,
                     [&](const OpContext& chunk_op, Buffer chunk) { host_.allreduce(chunk_op, chunk, reduce_op); });
}

void StagedBackend::broadcast(const OpContext& op, Buffer data, int root) {
  DeviceGuard guard(device_of(op));
  area(op).pipelined(op, data, data, /*copy_in=*/rank_ == root, true,
                     [&](const OpContext& chunk_op, Buffer chunk) { host_.broadcast(chunk_op, chunk, root); });
}

void StagedBackend::reduce(const OpContext& op, Buffer data, int root, ReduceOp reduce_op) {
  DeviceGuard guard(device_of(op));
  area(op).pipelined(op, data, data, true, /*copy_out=*/rank_ == root,
                     [&](const OpContext& chunk_op, Buffer chunk) { host_.reduce(chunk_op, chunk, root, reduce_op); });
}

void StagedBackend::allgather(const OpContext& op, ConstBuffer input, Buffer output) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, input, output, [&](ConstBuffer in, Buffer out) { host_.allgather(op, in, out); });
}

void StagedBackend::reduce_scatter(const OpContext& op, ConstBuffer input, Buffer output, ReduceOp reduce_op) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, input, output, [&](ConstBuffer in, Buffer out) { host_.reduce_scatter(op, in, out, reduce_op); });
}

void StagedBackend::gather(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, input, output, [&](ConstBuffer in, Buffer out) { host_.gather(op, in, out, root); });
}

void StagedBackend::scatter(const OpContext& op, ConstBuffer input, Buffer output, int root) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, input, output, [&](ConstBuffer in, Buffer out) { host_.scatter(op, in, out, root); });
}

void StagedBackend::all_to_all(const OpContext& op, ConstBuffer input, Buffer output, const BlockCounts& counts) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, input, output, [&](ConstBuffer in, Buffer out) { host_.all_to_all(op, in, out, counts); });
}

void StagedBackend::allgather_v(const OpContext& op, ConstBuffer input, Buffer output,
                                const std::vector<std::size_t>& counts) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, input, output, [&](ConstBuffer in, Buffer out) { host_.allgather_v(op, in, out, counts); });
}

void StagedBackend::send(const OpContext& op, ConstBuffer data, int dst, int tag) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, data, Buffer{nullptr, 0, data.dtype}, [&](ConstBuffer in, Buffer) { host_.send(op, in, dst, tag); });
}

void StagedBackend::recv(const OpContext& op, Buffer data, int src, int tag) {
  DeviceGuard guard(device_of(op));
  area(op).whole(op, ConstBuffer{nullptr, 0, data.dtype}, data, [&](ConstBuffer, Buffer out) { host_.recv(op, out, src, tag); });
}

int StagedBackend::recv_any(const OpContext& op, Buffer data, int tag) {
  DeviceGuard guard(device_of(op));
  int source = -1;
  area(op).whole(op, ConstBuffer{nullptr, 0, data.dtype}, data,
                 [&](ConstBuffer, Buffer out) { source = host_.recv_any(op, out, tag); });
  return source;
}

}  // namespace lockstep::cuda
