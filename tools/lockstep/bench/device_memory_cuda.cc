// `lockstep bench --device cuda` with the CUDA runtime.
#include <algorithm>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "bench/device_memory.h"
#include "common/clock.h"
#include "lockstep/error.h"

namespace lockstep::cli {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(fmt::format("bench: {}: CUDA error {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status)));
}

class CudaMemory final : public DeviceMemory {
 public:
  explicit CudaMemory(int index) : index_(index) { check(cudaSetDevice(index), "selecting the device"); }

  Device device() const override { return Device::cuda(index_); }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "allocating device memory");
    return p;
  }
  void release(void* memory) override { cudaFree(memory); }

  void upload(void* device, const void* host, std::size_t bytes) override {
    check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "copying to the device");
  }
  void download(void* host, const void* device, std::size_t bytes) override {
    check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copying from the device");
  }

  CopyRates pinned_copy_rates(std::size_t bytes) override {
    void *pinned = nullptr, *pinned_back = nullptr;
    check(cudaMallocHost(&pinned, bytes), "allocating pinned memory");
    check(cudaMallocHost(&pinned_back, bytes), "allocating pinned memory");
    void* device = allocate(bytes);
    void* device_back = allocate(bytes);
    cudaStream_t up = nullptr, down = nullptr;
    check(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking), "creating a stream");
    check(cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking), "creating a stream");
    // The median rate of `copy` (which moves `bytes` and returns once done)
    // over 9 timed runs after a warm-up.
    const auto median_rate = [&](const auto& copy) {
      constexpr int kReps = 9;
      std::vector<double> rates;
      for (int i = 0; i <= kReps; ++i) {
        const auto start = Clock::now();
        copy();
        if (i > 0) rates.push_back(static_cast<double>(bytes) / seconds_between(start, Clock::now()) / 1e9);
      }
      std::nth_element(rates.begin(), rates.begin() + kReps / 2, rates.end());
      return rates[kReps / 2];
    };
    CopyRates rates;
    rates.to_device = median_rate(
        [&] { check(cudaMemcpy(device, pinned, bytes, cudaMemcpyHostToDevice), "timing a copy"); });
    rates.to_host = median_rate(
        [&] { check(cudaMemcpy(pinned, device, bytes, cudaMemcpyDeviceToHost), "timing a copy"); });
    rates.both_ways = median_rate([&] {
      check(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, up), "timing a copy");
      check(cudaMemcpyAsync(pinned_back, device_back, bytes, cudaMemcpyDeviceToHost, down), "timing a copy");
      check(cudaStreamSynchronize(up), "timing a copy");
      check(cudaStreamSynchronize(down), "timing a copy");
    });
    cudaStreamDestroy(up);
    cudaStreamDestroy(down);
    release(device);
    release(device_back);
    cudaFreeHost(pinned);
    cudaFreeHost(pinned_back);
    return rates;
  }

 private:
  const int index_;
};

}  // namespace

std::unique_ptr<DeviceMemory> open_device_memory(int local_rank) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0)
    throw ConfigError(fmt::format("--device cuda: this process sees no CUDA device ({})",
                                  status != cudaSuccess ? cudaGetErrorString(status) : "none found"));
  return std::make_unique<CudaMemory>(local_rank % count);
}

}  // namespace lockstep::cli
