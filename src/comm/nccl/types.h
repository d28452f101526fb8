// What lockstep's element types and reduction operators become in NCCL, and
// the one place an ncclResult_t becomes a lockstep Error. Stateless;
// thread-safe.
#pragma once

#include <nccl.h>

#include <string_view>

#include "lockstep/types.h"

namespace lockstep::nccl {

ncclDataType_t to_nccl(DType dtype);
ncclRedOp_t to_nccl(ReduceOp op);

// Whether NCCL reduces `dtype` with `op` the way lockstep defines it.
bool reduces_like_lockstep(DType dtype, ReduceOp op);

// Throws unless `result` is ncclSuccess: "<what>: NCCL error <name> (<last
// error text>)". `comm` (may be null) gives NCCL's own last error text,
// which usually names the real cause. A remote error is a PeerError, an
// invalid argument or usage an InvalidArgument, the rest Error.
void check(ncclResult_t result, ncclComm_t comm, std::string_view what);

}  // namespace lockstep::nccl
