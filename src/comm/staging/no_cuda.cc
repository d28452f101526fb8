// The group's CUDA runtime in a lockstep built without the CUDA toolkit:
// any operation on CUDA memory says so, and how to get it.
#include "comm/device_memory.h"
#include "device/availability.h"

namespace lockstep {

std::unique_ptr<DeviceRuntime> make_device_runtime(const Config&, const Logger&) {
  throw built_without_cuda("this operation is");
}

}  // namespace lockstep
