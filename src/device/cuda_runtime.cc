// See cuda_runtime.h.
#include "device/cuda_runtime.h"

#include <thread>

#include <fmt/format.h>

#include "device/availability.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
namespace {

// A device wait first spins for a while, since a chunk's copy takes tens of
// microseconds and a sleep costs about as much again in timer slack; then
// it polls this often, so a long wait does not take a core from the host
// backend running beside it.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kPollInterval = std::chrono::microseconds(20);

// Waits until `done()`, spinning then sleeping; false when `give_up()` first.
template <typename Done, typename GiveUp>
bool poll(Done done, GiveUp give_up) {
  const auto spin_until = Clock::now() + kSpin;
  while (!done()) {
    if (give_up()) return false;
    if (Clock::now() < spin_until) std::this_thread::yield();
    else std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

}  // namespace

void check(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  throw Error(fmt::format("{}: CUDA error {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status)));
}

int visible_devices(std::string_view what_is) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0)
    throw ConfigError(fmt::format(
        "{} on CUDA memory, but this process sees no CUDA device ({}). Check the driver (nvidia-smi) and "
        "CUDA_VISIBLE_DEVICES",
        what_is,
        status != cudaSuccess ? fmt::format("{}: {}", cudaGetErrorName(status), cudaGetErrorString(status))
                              : "cudaGetDeviceCount found none"));
  return count;
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "reading the current CUDA device");
  if (previous_ != device) check(cudaSetDevice(device), fmt::format("making cuda:{} current", device));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

Stream::Stream() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a CUDA stream"); }

Stream::~Stream() { cudaStreamDestroy(stream_); }

Event::Event() { check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating a CUDA event"); }

Event::~Event() { cudaEventDestroy(event_); }

void Event::record(cudaStream_t stream) { check(cudaEventRecord(event_, stream), "recording a CUDA event"); }

bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  check(status, "waiting for the device");
  return true;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

std::byte* PinnedBuffer::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return data_;
  if (data_ != nullptr) check(cudaFreeHost(data_), "freeing pinned host memory");
  data_ = nullptr;
  bytes_ = 0;
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
        fmt::format("allocating {} bytes of pinned host memory for staging", bytes));
  data_ = static_cast<std::byte*>(p);
  bytes_ = bytes;
  return data_;
}

bool wait_for(const Event& event, Deadline deadline, const std::function<bool()>& cancelled) {
  return poll([&] { return event.query(); }, [&] { return (cancelled && cancelled()) || deadline.expired(); });
}

bool wait_for(const Event& event, Duration timeout) { return wait_for(event, Deadline::after(timeout), nullptr); }

}  // namespace lockstep::cuda

namespace lockstep {

bool built_with_cuda() { return true; }

}  // namespace lockstep
