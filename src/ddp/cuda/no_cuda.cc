// The Reducer's buckets in a lockstep built without the CUDA toolkit:
// gradients in CUDA memory are refused, saying how to get CUDA.
#include "ddp/bucket_memory.h"
#include "device/availability.h"

namespace lockstep::detail {

std::unique_ptr<BucketMemory> cuda_bucket_memory(Device) { throw built_without_cuda("the model's gradients are"); }

}  // namespace lockstep::detail
