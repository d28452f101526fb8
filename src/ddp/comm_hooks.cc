// Built-in communication hooks: plain average, and fp16 / bf16 compression.
// Compression keeps 16-bit scratch per bucket, keyed by the bucket's memory
// and kept in the same memory (host or device), so one hook object may
// serve several reducers at once. Thread-safe.
#include <map>
#include <mutex>

#include "ddp/bucket_memory.h"
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
// the receiving side, and widens into the bucket when done: on host memory
// in a continuation of the collective (Work::then, on the progress thread),
// on CUDA memory in finish(), on the stream the wait ordered after the
// collective.
class CompressHook final : public CommHook {
 public:
  explicit CompressHook(DType wire) : wire_(wire) {}
  std::string name() const override { return wire_ == DType::f16 ? "fp16_compress" : "bf16_compress"; }

  std::shared_ptr<Work> run(ProcessGroup& pg, const GradBucket& bucket) override {
    if (bucket.buffer.dtype != DType::f32) return pg.allreduce(bucket.input, bucket.buffer, ReduceOp::avg);
    const std::size_t n = bucket.buffer.count;
    const Device device = bucket.buffer.device;
    void* stream = bucket.buffer.stream;
    Scratch& scratch = scratch_for(bucket);
    scratch.memory->narrow(static_cast<const float*>(bucket.input.data), scratch.wire.get(), n,
                           1.0f / static_cast<float>(pg.size()), wire_, stream);
    auto work = pg.allreduce(Buffer{scratch.wire.get(), n, wire_, device, stream}, ReduceOp::sum);
    if (device.is_cuda()) return work;
    auto* reduced = static_cast<float*>(bucket.buffer.data);
    return work->then([&scratch, reduced, n, wire = wire_](const Work&) {
      scratch.memory->widen(scratch.wire.get(), reduced, n, wire, nullptr);
    });
  }

  void finish(const GradBucket& bucket) override {
    if (bucket.buffer.dtype != DType::f32 || !bucket.buffer.device.is_cuda()) return;
    Scratch& scratch = scratch_for(bucket);
    scratch.memory->widen(scratch.wire.get(), static_cast<float*>(bucket.buffer.data), bucket.buffer.count, wire_,
                          bucket.buffer.stream);
  }

  bool out_of_place() const override { return true; }

 private:
  // The 16-bit copy of one bucket, in the bucket's memory.
  struct Scratch {
    std::unique_ptr<detail::BucketMemory> memory;
    std::shared_ptr<std::byte[]> wire;
    std::size_t count = 0;
  };

  Scratch& scratch_for(const GradBucket& bucket) {
    std::lock_guard lock(mutex_);
    Scratch& scratch = scratch_[bucket.buffer.data];
    if (!scratch.memory || scratch.memory->device() != bucket.buffer.device) {
      scratch.memory = detail::bucket_memory_for(bucket.buffer.device);
      scratch.wire.reset();
    }
    if (!scratch.wire || scratch.count < bucket.buffer.count) {
      scratch.wire = scratch.memory->allocate_scratch(bucket.buffer.count * dtype_size(wire_), bucket.buffer.stream);
      scratch.count = bucket.buffer.count;
    }
    return scratch;
  }

  DType wire_;
  std::mutex mutex_;  // guards the map; each entry is used by one bucket at a time
  std::map<const void*, Scratch> scratch_;
};

}  // namespace

std::shared_ptr<CommHook> allreduce_hook() { return std::make_shared<AllreduceHook>(); }
std::shared_ptr<CommHook> fp16_compress_hook() { return std::make_shared<CompressHook>(DType::f16); }
std::shared_ptr<CommHook> bf16_compress_hook() { return std::make_shared<CompressHook>(DType::bf16); }

}  // namespace lockstep
