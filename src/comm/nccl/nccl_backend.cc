// See nccl_backend.h: construction, what NCCL supports, barrier, shutdown.
// The collectives are in collectives.cc and point_to_point.cc.
#include "comm/nccl/nccl_backend.h"

#include <fmt/format.h>

#include "comm/nccl/types.h"

namespace lockstep::nccl {
namespace {

// cuda:(local rank % visible devices), so ranks of one host spread over its
// GPUs whatever CUDA_VISIBLE_DEVICES leaves visible.
int choose_device(const BackendContext& ctx) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0)
    throw ConfigError(fmt::format("rank {}/{}: backend nccl needs a CUDA device, but this process sees none ({}); "
                                  "check the GPU driver and CUDA_VISIBLE_DEVICES, or choose backend auto, shm or tcp "
                                  "(they take CUDA memory by staging it through the host)",
                                  ctx.rank, ctx.size,
                                  status != cudaSuccess
                                      ? fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(status))
                                      : std::string("cudaGetDeviceCount found 0 devices")));
  const int local_rank = ctx.config.local_rank.value_or(ctx.config.launcher.local_rank);
  return local_rank % count;
}

}  // namespace

NcclBackend::NcclBackend(const BackendContext& ctx)
    : rank_(ctx.rank), size_(ctx.size), device_(choose_device(ctx)) {
  cuda::DeviceGuard guard(device_);
  host_stream_ = std::make_unique<cuda::Stream>();
  done_ = std::make_unique<cuda::Event>();
  comm_ = std::make_unique<Communicator>(ctx, device_);
  ctx.log.info("nccl backend on cuda:{} (NCCL {}.{}.{})", device_, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

// The communicator goes first (aborted if shutdown() did not run); the
// CUDA objects need the backend's device current.
NcclBackend::~NcclBackend() {
  int previous = -1;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device_) == cudaSuccess;
  comm_.reset();
  done_.reset();
  host_stream_.reset();
  if (switched && previous != device_) cudaSetDevice(previous);
}

bool NcclBackend::supports(Collective collective, DType dtype, ReduceOp op) const {
  switch (collective) {
    case Collective::allreduce:
    case Collective::reduce_scatter:
    case Collective::reduce: return reduces_like_lockstep(dtype, op);
    default: return true;
  }
}

Placement NcclBackend::place(const OpContext& op) {
  return Placement(PlacementResources{device_, host_stream_->get(), &input_scratch_, &output_scratch_, done_.get(),
                                      comm_.get(), &last_deferred_},
                   op);
}

void NcclBackend::barrier(const OpContext& op) {
  cuda::DeviceGuard guard(device_);
  ncclComm_t comm = comm_->get(op);
  void* word = barrier_word_.reserve(sizeof(float));
  const Placement p = place(op);  // on the backend's stream, after any deferred operation
  comm_->settle(ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, comm, p.stream()), op, "queueing the barrier");
  done_->record(p.stream());
  comm_->wait(*done_, op, "waiting for the other ranks at the barrier");
}

void NcclBackend::shutdown(Deadline deadline) {
  try {
    cuda::DeviceGuard guard(device_);
    comm_->shutdown(deadline);
  } catch (const Error&) {
    // A clean exit must not fail: the communicator's destructor aborts it.
  }
}

}  // namespace lockstep::nccl

namespace lockstep {

std::unique_ptr<Backend> make_nccl_backend(const BackendContext& ctx) {
  return std::make_unique<nccl::NcclBackend>(ctx);
}

}  // namespace lockstep
