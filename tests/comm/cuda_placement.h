// A Placement (comm/placement.h) in CUDA memory, ordered by a stream the
// way a training step orders its tensors: each input is copied to the
// device on the rank's stream, from pinned memory, behind a host function
// that holds the stream for a while, so a collective that did not wait for
// the stream would read the device memory before the copy landed (it holds
// a poison pattern until then). After Work::wait() the results are copied
// back on the same stream, which wait() made wait for the collective.
// Not thread-safe: one per rank.
#pragma once

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "comm/placement.h"

namespace lockstep::testing {

// Whether this process sees a CUDA device; `why` says why not.
inline bool cuda_device_present(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return true;
  *why = status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device";
  return false;
}

class CudaPlacement final : public Placement {
 public:
  CudaPlacement(int device, cudaStream_t stream, std::chrono::milliseconds hold = std::chrono::milliseconds(20))
      : device_(device), stream_(stream), hold_(hold) {}
  ~CudaPlacement() override { release(); }

  Buffer place(std::vector<std::byte>& host, std::size_t count, DType dtype) override {
    Copy& c = stage(host.data(), host.size());
    c.back_to = &host;
    return Buffer{count > 0 ? c.device : nullptr, count, dtype, Device::cuda(device_), stream_};
  }

  ConstBuffer place_input(const std::vector<std::byte>& host, std::size_t count, DType dtype) override {
    Copy& c = stage(host.data(), host.size());
    return ConstBuffer{count > 0 ? c.device : nullptr, count, dtype, Device::cuda(device_), stream_};
  }

  void finish(Work& work) override {
    work.wait();
    for (Copy& c : copies_)
      if (c.back_to != nullptr && c.bytes > 0)
        check(cudaMemcpyAsync(c.pinned, c.device, c.bytes, cudaMemcpyDeviceToHost, stream_));
    check(cudaStreamSynchronize(stream_));
    for (Copy& c : copies_)
      if (c.back_to != nullptr && c.bytes > 0) std::memcpy(c.back_to->data(), c.pinned, c.bytes);
    release();
  }

 private:
  struct Copy {
    void* device = nullptr;
    void* pinned = nullptr;
    std::size_t bytes = 0;
    std::vector<std::byte>* back_to = nullptr;
  };

  static void check(cudaError_t status) {
    if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(status));
  }

  static void CUDART_CB hold_stream(void* ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
  }

  Copy& stage(const std::byte* host, std::size_t bytes) {
    check(cudaSetDevice(device_));
    Copy& c = copies_.emplace_back();
    c.bytes = bytes;
    if (bytes == 0) return c;
    check(cudaMalloc(&c.device, bytes));
    check(cudaMemsetAsync(c.device, 0xa5, bytes, stream_));  // the poison a collective that ran early would read
    check(cudaMallocHost(&c.pinned, bytes));
    std::memcpy(c.pinned, host, bytes);
    check(cudaStreamSynchronize(stream_));
    hold_ms_ = static_cast<int>(hold_.count());
    check(cudaLaunchHostFunc(stream_, hold_stream, &hold_ms_));
    check(cudaMemcpyAsync(c.device, c.pinned, bytes, cudaMemcpyHostToDevice, stream_));
    return c;
  }

  void release() {
    if (copies_.empty()) return;
    cudaStreamSynchronize(stream_);
    for (Copy& c : copies_) {
      if (c.device != nullptr) cudaFree(c.device);
      if (c.pinned != nullptr) cudaFreeHost(c.pinned);
    }
    copies_.clear();
  }

  const int device_;
  const cudaStream_t stream_;
  const std::chrono::milliseconds hold_;
  int hold_ms_ = 0;
  std::vector<Copy> copies_;
};

}  // namespace lockstep::testing
