// Built-in communication hooks: plain average, and fp16 / bf16 compression.
// Compression keeps 16-bit scratch per bucket, keyed by the bucket's memory,
// so one hook object may serve several reducers at once. Thread-safe.
#include <algorithm>
#include <map>
#include <mutex>

#include "comm/reduce_kernels.h"
#include "common/half.h"
#include "lockstep/reducer.h"

namespace lockstep {
namespace {

class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override {
    return pg.allreduce(bucket.input, bucket.buffer, ReduceOp::avg);
  }
  bool out_of_place() const override { return true; }
};

// Divides by the world size first (as PyTorch's hook does) so that sums of
// large gradients stay within fp16's range, sends 16 bits, sums in fp32 on
// the receiving side, and widens into the bucket when done.
class CompressHook final : public CommHook {
 public:
  explicit CompressHook(DType wire) : wire_(wire) {}
  std::string name() const override { return wire_ == DType::f16 ? "fp16_compress" : "bf16_compress"; }

  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override {
    if (bucket.buffer.dtype != DType::f32) return pg.allreduce(bucket.input, bucket.buffer, ReduceOp::avg);
    const std::size_t n = bucket.buffer.count;
    std::vector<std::uint16_t>* scratch = nullptr;
    {
      std::lock_guard lock(mutex_);
      scratch = &scratch_[bucket.buffer.data];
    }
    scratch->resize(n);
    scale_and_narrow(static_cast<const float*>(bucket.input.data), scratch->data(), n, 1.0f / static_cast<float>(pg.size()));
    auto work = pg.allreduce(Buffer{scratch->data(), n, wire_}, ReduceOp::sum);
    auto* reduced = static_cast<float*>(bucket.buffer.data);
    const DType wire = wire_;
    work->on_complete([scratch, reduced, n, wire](const Work& w) {
      if (!w.error()) widen_to_f32(scratch->data(), reduced, n, wire);
    });
    return work;
  }
  bool out_of_place() const override { return true; }

 private:
  // wire = narrow(grads x scale), a block at a time (one pass over grads).
  void scale_and_narrow(const float* grads, std::uint16_t* wire, std::size_t n, float scale) const {
    constexpr std::size_t kBlock = 1024;
    float block[kBlock];
    for (std::size_t i = 0; i < n; i += kBlock) {
      const std::size_t m = std::min(kBlock, n - i);
      for (std::size_t j = 0; j < m; ++j) block[j] = grads[i + j] * scale;
      narrow_from_f32(block, wire + i, m, wire_);
    }
  }

  DType wire_;
  std::mutex mutex_;  // guards the map; each entry is used by one bucket at a time
  std::map<const void*, std::vector<std::uint16_t>> scratch_;
};

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllreduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() { return std::make_shared<CompressHook>(DType::f16); }
std::shared_ptr<CommHook> bf16_compress_hook() { return std::make_shared<CompressHook>(DType::bf16); }

}  // namespace lockstep
