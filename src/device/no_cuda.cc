// The device layer of a lockstep built without the CUDA toolkit: it has no
// device objects to offer, only the answer that there is no CUDA.
#include "device/availability.h"

namespace lockstep {

bool built_with_cuda() { return false; }

}  // namespace lockstep
