// See types.h.
#include "comm/nccl/types.h"

#include <fmt/format.h>

#include <string>

#include "lockstep/error.h"

namespace lockstep::nccl {

ncclDataType_t to_nccl(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
  }
  throw InvalidArgument(fmt::format("the nccl backend has no type for dtype {}", static_cast<int>(dtype)));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::premul_sum: break;  // the front end premultiplies and asks for sum
  }
  throw InvalidArgument(fmt::format("the nccl backend cannot reduce with {}", to_string(op)));
}

// Every type and operator but premul_sum, which the front end turns into a
// sum after premultiplying. ncclAvg on integers is NCCL's sum (wrapping in
// the element type) followed by one C division by n, which truncates toward
// zero: lockstep's definition.
bool reduces_like_lockstep(DType dtype, ReduceOp op) { return op != ReduceOp::premul_sum; }

void check(ncclResult_t result, ncclComm_t comm, std::string_view what) {
  if (result == ncclSuccess) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  const std::string message = fmt::format("{}: NCCL error {} ({})", what, ncclGetErrorString(result),
                                          last != nullptr && last[0] != '\0' ? last : "no further detail");
  switch (result) {
    case ncclRemoteError: throw PeerError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage: throw InvalidArgument(message);
    default: throw Error(message);
  }
}

}  // namespace lockstep::nccl
