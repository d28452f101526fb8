// The CUDA runtime of one group (comm/device_memory.h): checks that this
// process sees the devices it is asked to use, keeps the group's stream on
// each device it uses, and makes the staging backend.
// Thread-safety: order_after may be called from any thread (streams_mutex_
// guards the streams); staged_over once, by the group.
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "comm/device_memory.h"
#include "comm/staging/staged_backend.h"
#include "comm/staging/stream_order.h"

namespace lockstep {
namespace {

constexpr std::size_t kDefaultStagingChunkBytes = 4 << 20;

class CudaRuntime final : public DeviceRuntime {
 public:
  explicit CudaRuntime(const Config& config)
      : devices_(cuda::visible_devices("this operation is")),
        chunk_bytes_(config.cuda_staging_chunk_bytes.value_or(kDefaultStagingChunkBytes)) {}

  std::shared_ptr<detail::StreamOrder> order_after(Device device, void* caller_stream) override {
    if (device.index < 0 || device.index >= devices_)
      throw InvalidArgument(fmt::format("the buffers are on {}, but this process sees {} CUDA device{} (0 to {})",
                                        to_string(device), devices_, devices_ == 1 ? "" : "s", devices_ - 1));
    cuda::DeviceGuard guard(device.index);
    return std::make_shared<cuda::CudaStreamOrder>(device, static_cast<cudaStream_t>(caller_stream),
                                                   group_stream(device.index));
  }

  std::unique_ptr<Backend> staged_over(Backend& host, int rank) override {
    return std::make_unique<cuda::StagedBackend>(host, rank, chunk_bytes_);
  }

 private:
  // The group's stream on `device` (current), made on first use.
  cudaStream_t group_stream(int device) {
    std::lock_guard lock(streams_mutex_);
    auto& stream = streams_[device];
    if (!stream) stream = std::make_unique<cuda::Stream>();
    return stream->get();
  }

  const int devices_;
  const std::size_t chunk_bytes_;
  std::mutex streams_mutex_;
  std::map<int, std::unique_ptr<cuda::Stream>> streams_;
};

}  // namespace

std::unique_ptr<DeviceRuntime> make_device_runtime(const Config& config, const Logger&) {
  return std::make_unique<CudaRuntime>(config);
}

}  // namespace lockstep
