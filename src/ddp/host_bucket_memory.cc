// Buckets in host memory: every operation happens at once; streams are
// ignored. See bucket_memory.h.
#include <algorithm>
#include <cstring>

#include "comm/reduce_kernels.h"
#include "ddp/bucket_memory.h"
#include "ddp/low_rank.h"

namespace lockstep::detail {
namespace {

class HostValues final : public ValuesReadBack {
 public:
  explicit HostValues(std::vector<double> values) : values_(std::move(values)) {}
  bool ready() override { return true; }
  std::vector<double> values(Duration) override { return values_; }

 private:
  std::vector<double> values_;
};

class HostBucketMemory final : public BucketMemory {
 public:
  Device device() const override { return Device::host(); }

  std::shared_ptr<std::byte[]> allocate_bucket(ProcessGroup& pg, std::size_t bytes) override {
    return pg.allocate_shared(bytes);
  }

  std::shared_ptr<std::byte[]> allocate_scratch(std::size_t bytes, void*) override {
    return std::shared_ptr<std::byte[]>(new std::byte[bytes]());
  }

  void copy(void* dst, const void* src, std::size_t bytes, void*) override { std::memcpy(dst, src, bytes); }

  void zero(void* dst, std::size_t bytes, void*) override { std::memset(dst, 0, bytes); }

  void write(void* dst, DType dtype, const std::vector<double>& values, void*) override {
    for (std::size_t i = 0; i < values.size(); ++i) store_from_double(dst, dtype, i, values[i]);
  }

  std::unique_ptr<ValuesReadBack> read(const void* src, DType dtype, std::size_t count, void*) override {
    std::vector<double> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = load_as_double(src, dtype, i);
    return std::make_unique<HostValues>(std::move(values));
  }

  void scale(void* data, std::size_t count, DType dtype, double factor, void*) override {
    switch (dtype) {
      case DType::f32: {
        auto* p = static_cast<float*>(data);
        for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<float>(p[i] * factor);
        break;
      }
      case DType::f64: {
        auto* p = static_cast<double*>(data);
        for (std::size_t i = 0; i < count; ++i) p[i] *= factor;
        break;
      }
      case DType::f16:
      case DType::bf16:
        for (std::size_t i = 0; i < count; ++i) store_from_double(data, dtype, i, load_as_double(data, dtype, i) * factor);
        break;
      default: break;  // integer gradients are not averaged
    }
  }

  // One pass over the input, a block at a time.
  void narrow(const float* in, void* out, std::size_t count, float factor, DType wire, void*) override {
    constexpr std::size_t kBlock = 1024;
    float block[kBlock];
    auto* wire_bytes = static_cast<std::byte*>(out);
    for (std::size_t i = 0; i < count; i += kBlock) {
      const std::size_t m = std::min(kBlock, count - i);
      for (std::size_t j = 0; j < m; ++j) block[j] = in[i + j] * factor;
      narrow_from_f32(block, wire_bytes + i * dtype_size(wire), m, wire);
    }
  }

  void widen(const void* in, float* out, std::size_t count, DType wire, void*) override {
    widen_to_f32(in, out, count, wire);
  }

  void order(void*, void*) override {}

  void low_rank_multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r, float* p,
                         void*) override {
    low_rank::multiply(a, n, m, q, r, p);
  }
  void low_rank_multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p, std::size_t r,
                                    float* q, void*) override {
    low_rank::multiply_transposed(a, n, m, p, r, q);
  }
  void low_rank_reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r, float* a,
                            void*) override {
    low_rank::reconstruct(p, q, n, m, r, a);
  }
  void low_rank_orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon, void*) override {
    low_rank::orthogonalize(p, n, r, epsilon);
  }
  void feedback_add(float* m, float* e, std::size_t count, void*) override {
    for (std::size_t i = 0; i < count; ++i) {
      m[i] += e[i];
      e[i] = m[i];
    }
  }
  void feedback_subtract(float* e, const float* m, std::size_t count, void*) override {
    for (std::size_t i = 0; i < count; ++i) e[i] -= m[i];
  }
};

}  // namespace

std::unique_ptr<BucketMemory> host_bucket_memory() { return std::make_unique<HostBucketMemory>(); }

}  // namespace lockstep::detail
