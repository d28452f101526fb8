// See placement.h.
#include "comm/nccl/placement.h"

#include <fmt/format.h>

#include "comm/device_memory.h"

namespace lockstep::nccl {
namespace {

// A deferred operation's end: polled by the progress engine.
class DeviceCompletion final : public PendingCompletion {
 public:
  DeviceCompletion(std::shared_ptr<cuda::Event> done, Communicator* comm, int device, std::string what)
      : done_(std::move(done)), comm_(comm), device_(device), what_(std::move(what)) {}
  bool poll(const OpContext& op) override {
    cuda::DeviceGuard guard(device_);
    return comm_->poll(*done_, op, what_);
  }

 private:
  std::shared_ptr<cuda::Event> done_;
  Communicator* comm_;
  int device_;
  std::string what_;
};

}  // namespace

Placement::Placement(const PlacementResources& resources, const OpContext& op) : resources_(resources), op_(op) {
  if (op.streams != nullptr) {
    check_device(op.streams->device(), "buffers");
    stream_ = static_cast<cudaStream_t>(op.streams->stream());
    return;
  }
  stream_ = resources.host_stream;
  // NCCL runs a communicator's operations in the order they are queued
  // only within a stream: behind deferred operations on other streams,
  // the backend's stream waits for the last of them on the device.
  if (resources.last_deferred != nullptr && *resources.last_deferred)
    cuda::check(cudaStreamWaitEvent(stream_, (*resources.last_deferred)->get(), 0),
                "ordering a host-memory nccl operation after the device operations before it");
}

void Placement::check_device(Device device, const char* name) const {
  if (device.is_cuda() && device.index == resources_.device) return;
  throw InvalidArgument(fmt::format("{}: the {} are on {}, but this rank's nccl backend runs on cuda:{}; pass CUDA "
                                    "memory of cuda:{} (each rank of an nccl group uses one device, chosen from its "
                                    "local rank)",
                                    op_.description(), name, to_string(device), resources_.device,
                                    resources_.device));
}

const void* Placement::input(ConstBuffer b) {
  if (!on_host()) {
    if (b.count != 0) check_device(b.device, "input buffers");
    return b.data;
  }
  void* scratch = resources_.input->reserve(b.bytes());
  if (b.count != 0)
    cuda::check(cudaMemcpyAsync(scratch, b.data, b.bytes(), cudaMemcpyHostToDevice, stream_),
                "copying a host buffer to the device for nccl");
  return scratch;
}

void* Placement::output(Buffer b, bool copy_in, bool copy_back) {
  if (!on_host()) {
    if (b.count != 0) check_device(b.device, "output buffers");
    return b.data;
  }
  void* scratch = resources_.output->reserve(b.bytes());
  if (copy_in && b.count != 0)
    cuda::check(cudaMemcpyAsync(scratch, b.data, b.bytes(), cudaMemcpyHostToDevice, stream_),
                "copying a host buffer to the device for nccl");
  if (copy_back && b.count != 0) copy_back_.emplace_back(b, scratch);
  return scratch;
}

void Placement::wait(std::string_view what) {
  resources_.done->record(stream_);
  resources_.comm->wait(*resources_.done, op_, what);
}

// The copies back wait for NCCL first: a copy to pageable host memory may
// block the calling thread until it is done, which must not happen while
// the collective can still hang.
void Placement::finish(std::string_view what) {
  if (!on_host() && op_.defer != nullptr) {
    auto done = std::make_shared<cuda::Event>();
    done->record(stream_);
    if (resources_.last_deferred != nullptr) *resources_.last_deferred = done;
    *op_.defer = std::make_unique<DeviceCompletion>(std::move(done), resources_.comm, resources_.device,
                                                    std::string(what));
    return;
  }
  wait(what);
  if (copy_back_.empty()) return;
  for (const auto& [host, scratch] : copy_back_)
    cuda::check(cudaMemcpyAsync(host.data, scratch, host.bytes(), cudaMemcpyDeviceToHost, stream_),
                "copying the nccl result back to host memory");
  wait("copying the result back to host memory");
}

}  // namespace lockstep::nccl
