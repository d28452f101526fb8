// Where a Reducer's buckets live, and the few things it does to them:
// allocate, copy gradients in, zero, write and read its flags, scale.
// Host memory does each at once. CUDA memory queues each on a stream, the
// one the framework computes gradients on, so that it runs after the
// gradient was produced and before the collective that the stream orders
// next; nothing blocks the host except reading values back (values()).
//
// The choice is made once, by the gradients' device (GradientSource::
// device()); the CUDA side lives in src/ddp/cuda/ and, in a lockstep built
// without CUDA, says how to get it.
// Not thread-safe: one Reducer's thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "lockstep/process_group.h"
#include "lockstep/types.h"

namespace lockstep::detail {

// Values copied out of bucket memory. values() waits until the copy is
// done (CUDA: until the stream reached the point of the read) or `timeout`
// passed (TimeoutError).
class ValuesReadBack {
 public:
  virtual ~ValuesReadBack() = default;
  // Whether values() would return at once.
  virtual bool ready() = 0;
  virtual std::vector<double> values(Duration timeout) = 0;
};

class BucketMemory {
 public:
  virtual ~BucketMemory() = default;
  virtual Device device() const = 0;
  // A bucket of `bytes`, zeroed. Host: ProcessGroup::allocate_shared, so
  // collective (every rank, same sizes, same order).
  virtual std::shared_ptr<std::byte[]> allocate_bucket(ProcessGroup& pg, std::size_t bytes) = 0;
  // Scratch of `bytes`, zeroed once `stream` reaches this point; not collective.
  virtual std::shared_ptr<std::byte[]> allocate_scratch(std::size_t bytes, void* stream) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes, void* stream) = 0;
  virtual void zero(void* dst, std::size_t bytes, void* stream) = 0;
  // dst[i] = values[i], converted to `dtype` (floats rounded to nearest even).
  virtual void write(void* dst, DType dtype, const std::vector<double>& values, void* stream) = 0;
  virtual std::unique_ptr<ValuesReadBack> read(const void* src, DType dtype, std::size_t count, void* stream) = 0;
  // data[0, count) *= factor, for floating dtypes (integers are left alone).
  virtual void scale(void* data, std::size_t count, DType dtype, double factor, void* stream) = 0;
  // For compression hooks: out[i] = in[i] * factor rounded to the 16-bit
  // `wire` type (f16 or bf16, to nearest even), and back to f32.
  virtual void narrow(const float* in, void* out, std::size_t count, float factor, DType wire, void* stream) = 0;
  virtual void widen(const void* in, float* out, std::size_t count, DType wire, void* stream) = 0;
  // Work queued on `later` from now on runs after the work queued on
  // `earlier` so far. Host memory: nothing to do.
  virtual void order(void* earlier, void* later) = 0;

  // PowerSGD's linear algebra on fp32 row-major matrices in this memory;
  // ddp/low_rank.h says what each computes (the host runs those functions).
  virtual void low_rank_multiply(const float* a, std::size_t n, std::size_t m, const float* q, std::size_t r,
                                 float* p, void* stream) = 0;
  virtual void low_rank_multiply_transposed(const float* a, std::size_t n, std::size_t m, const float* p,
                                            std::size_t r, float* q, void* stream) = 0;
  virtual void low_rank_reconstruct(const float* p, const float* q, std::size_t n, std::size_t m, std::size_t r,
                                    float* a, void* stream) = 0;
  virtual void low_rank_orthogonalize(float* p, std::size_t n, std::size_t r, double epsilon, void* stream) = 0;
  // Error feedback: m[i] += e[i], then e[i] = m[i] (before compressing);
  // e[i] -= m[i] (after: what the compression lost).
  virtual void feedback_add(float* m, float* e, std::size_t count, void* stream) = 0;
  virtual void feedback_subtract(float* e, const float* m, std::size_t count, void* stream) = 0;
};

std::unique_ptr<BucketMemory> host_bucket_memory();
// Buckets in the memory of CUDA device `device.index`. Throws ConfigError
// in a lockstep built without CUDA (src/ddp/cuda/no_cuda.cc).
std::unique_ptr<BucketMemory> cuda_bucket_memory(Device device);

inline std::unique_ptr<BucketMemory> bucket_memory_for(Device device) {
  return device.is_cuda() ? cuda_bucket_memory(device) : host_bucket_memory();
}

}  // namespace lockstep::detail
