// Buckets in CUDA device memory (ddp/bucket_memory.h). Every operation is
// queued on the stream it is given; the host waits only in a read-back's
// values(), and there by polling against a deadline.
//
// Small host <-> device transfers (the last bucket's flags) go through
// pinned slots, each with an event: a slot is reused only once the copy
// that last used it is done, so the host never writes memory a queued copy
// has yet to read, and never reads memory before the copy into it landed.
#include <fmt/format.h>

#include <vector>

#include "ddp/bucket_memory.h"
#include "ddp/cuda/bucket_kernels.h"
#include "ddp/cuda/low_rank_kernels.h"
#include "device/cuda_runtime.h"

namespace lockstep::cuda {
namespace {

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

Half16 half16(DType dtype) {
  if (dtype == DType::f16) return Half16::f16;
  if (dtype == DType::bf16) return Half16::bf16;
  throw InvalidArgument(fmt::format("{} is not a 16-bit floating type (f16 or bf16)", to_string(dtype)));
}

// A pinned host area and the event of the last copy that used it.
struct PinnedSlot {
  PinnedBuffer memory;
  Event copied;
};

// Values on their way into a pinned slot: the copy is queued on a stream,
// and values() waits for it.
class DeviceValues final : public detail::ValuesReadBack {
 public:
  DeviceValues(std::shared_ptr<PinnedSlot> slot, DType dtype, std::size_t count)
      : slot_(std::move(slot)), dtype_(dtype), count_(count) {}

  bool ready() override { return slot_->copied.query(); }

  std::vector<double> values(Duration timeout) override {
    if (!wait_for(slot_->copied, timeout))
      throw TimeoutError(fmt::format("reading {} value(s) back from the device took over {:.1f} s: the collective "
                                     "before it did not finish",
                                     count_, static_cast<double>(timeout.count()) / 1000.0));
    std::vector<double> out(count_);
    const std::byte* host = slot_->memory.reserve(count_ * dtype_size(dtype_));
    for (std::size_t i = 0; i < count_; ++i) out[i] = load_as_double(host, dtype_, i);
    return out;
  }

 private:
  std::shared_ptr<PinnedSlot> slot_;
  const DType dtype_;
  const std::size_t count_;
};

class CudaBucketMemory final : public detail::BucketMemory {
 public:
  explicit CudaBucketMemory(Device device) : device_(device) {
    const int count = visible_devices("the model's gradients are");
    if (device.index < 0 || device.index >= count)
      throw InvalidArgument(fmt::format("the gradients are on {}, but this process sees {} CUDA device(s)",
                                        to_string(device), count));
    DeviceGuard on(device_.index);
    order_event_ = std::make_unique<Event>();
  }

  // Events and pinned memory need no current device to be released.
  ~CudaBucketMemory() override = default;

  Device device() const override { return device_; }

  std::shared_ptr<std::byte[]> allocate_bucket(ProcessGroup&, std::size_t bytes) override {
    auto memory = allocate(bytes);
    DeviceGuard on(device_.index);
    check(cudaMemset(memory.get(), 0, bytes), fmt::format("zeroing a {}-byte bucket on {}", bytes, where()));
    return memory;
  }

  std::shared_ptr<std::byte[]> allocate_scratch(std::size_t bytes, void* stream) override {
    auto memory = allocate(bytes);
    zero(memory.get(), bytes, stream);
    return memory;
  }

  void copy(void* dst, const void* src, std::size_t bytes, void* stream) override {
    if (bytes == 0 || dst == src) return;
    DeviceGuard on(device_.index);
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)),
          fmt::format("copying a gradient into its bucket on {}", where()));
  }

  void zero(void* dst, std::size_t bytes, void* stream) override {
    if (bytes == 0) return;
    DeviceGuard on(device_.index);
    check(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)), fmt::format("zeroing bucket memory on {}", where()));
  }

  void write(void* dst, DType dtype, const std::vector<double>& values, void* stream) override {
    if (values.empty()) return;
    DeviceGuard on(device_.index);
    const std::size_t bytes = values.size() * dtype_size(dtype);
    auto slot = free_slot();
    std::byte* host = slot->memory.reserve(bytes);
    for (std::size_t i = 0; i < values.size(); ++i) store_from_double(host, dtype, i, values[i]);
    check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, as_stream(stream)),
          fmt::format("copying the bucket's flags to {}", where()));
    slot->copied.record(as_stream(stream));
  }

  std::unique_ptr<detail::ValuesReadBack> read(const void* src, DType dtype, std::size_t count,
                                               void* stream) override {
    DeviceGuard on(device_.index);
    auto slot = free_slot();
    const std::size_t bytes = count * dtype_size(dtype);
    std::byte* host = slot->memory.reserve(bytes);
    if (bytes > 0)
      check(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)),
            fmt::format("copying the bucket's flags from {}", where()));
    slot->copied.record(as_stream(stream));
    return std::make_unique<DeviceValues>(std::move(slot), dtype, count);
  }

  void scale(void* data, std::size_t count, DType dtype, double factor, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel(
        [&] {
          switch (dtype) {
            case DType::f32: launch_scale_f32(static_cast<float*>(data), count, factor, as_stream(stream)); break;
            case DType::f64: launch_scale_f64(static_cast<double*>(data), count, factor, as_stream(stream)); break;
            case DType::f16:
            case DType::bf16: launch_scale_16(data, count, half16(dtype), factor, as_stream(stream)); break;
            default: break;  // integer gradients are not averaged
          }
        },
        "scaling a bucket");
  }

  void narrow(const float* in, void* out, std::size_t count, float factor, DType wire, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_narrow(in, out, count, factor, half16(wire), as_stream(stream)); }, "compressing a bucket");
  }

  void widen(const void* in, float* out, std::size_t count, DType wire, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_widen(in, out, count, half16(wire), as_stream(stream)); }, "decompressing a bucket");
  }

  void low_rank_multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r, float* p,
                         void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_low_rank_multiply(a, n, m, q, r, p, as_stream(stream)); }, "PowerSGD's M Q");
  }

  void low_rank_multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r,
                                    float* q, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_low_rank_multiply_transposed(a, n, m, p, r, q, as_stream(stream)); }, "PowerSGD's M^T P");
  }

  void low_rank_reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r, float* a,
                            void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_low_rank_reconstruct(p, q, n, m, r, a, as_stream(stream)); }, "PowerSGD's P Q^T");
  }

  void low_rank_orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_low_rank_orthogonalize(p, n, r, epsilon, as_stream(stream)); },
               "PowerSGD's orthogonalisation");
  }

  void feedback_add(float* m, float* e, std::size_t count, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_feedback_add(m, e, count, as_stream(stream)); }, "PowerSGD's error feedback");
  }

  void feedback_subtract(float* e, const float* m, std::size_t count, void* stream) override {
    DeviceGuard on(device_.index);
    run_kernel([&] { launch_feedback_subtract(e, m, count, as_stream(stream)); }, "PowerSGD's error feedback");
  }

  void order(void* earlier, void* later) override {
    if (earlier == later) return;
    DeviceGuard on(device_.index);
    // A wait captures the event as it is at the call, so one event serves
    // every ordering in turn.
    order_event_->record(as_stream(earlier));
    check(cudaStreamWaitEvent(as_stream(later), order_event_->get(), 0),
          fmt::format("ordering one stream after another on {}", where()));
  }

 private:
  std::string where() const { return to_string(device_); }

  std::shared_ptr<std::byte[]> allocate(std::size_t bytes) {
    DeviceGuard on(device_.index);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes == 0 ? 1 : bytes),
          fmt::format("allocating {} bytes of gradient buckets on {}", bytes, where()));
    const int index = device_.index;
    // cudaFree waits for the device work that may still use the memory.
    return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [index](std::byte* q) {
      int previous = -1;
      cudaGetDevice(&previous);
      cudaSetDevice(index);
      cudaFree(q);
      if (previous >= 0) cudaSetDevice(previous);
    });
  }

  template <typename Launch>
  void run_kernel(Launch launch, std::string_view what) {
    try {
      launch();
    } catch (const std::exception& e) {
      throw Error(fmt::format("{} on {}: {}", what, where(), e.what()));
    }
  }

  // A slot no read-back holds and whose last copy is done; a new one if
  // every slot is busy (at most a few: one write and one read per step).
  std::shared_ptr<PinnedSlot> free_slot() {
    for (auto& slot : slots_)
      if (slot.use_count() == 1 && slot->copied.query()) return slot;
    slots_.push_back(std::make_shared<PinnedSlot>());
    return slots_.back();
  }

  const Device device_;
  std::unique_ptr<Event> order_event_;
  std::vector<std::shared_ptr<PinnedSlot>> slots_;
};

}  // namespace
}  // namespace lockstep::cuda

namespace lockstep::detail {

std::unique_ptr<BucketMemory> cuda_bucket_memory(Device device) {
  return std::make_unique<cuda::CudaBucketMemory>(device);
}

}  // namespace lockstep::detail
