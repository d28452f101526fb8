// MPI datatypes and ops for lockstep's dtypes; see types.h.
#include "comm/mpi/types.h"

#include <climits>

#include <fmt/format.h>

#include "comm/reduce_kernels.h"
#include "common/enforce.h"
#include "common/env_vars.h"
#include "common/format.h"
#include "lockstep/error.h"

namespace lockstep::mpi {
namespace {

DType dtype_of(MPI_Datatype type) {
  if (type == MPI_FLOAT) return DType::f32;
  if (type == MPI_DOUBLE) return DType::f64;
  if (type == MPI_INT32_T) return DType::i32;
  if (type == MPI_INT64_T) return DType::i64;
  return DType::u8;
}

// MPI user functions: inoutvec[i] = invec[i] op inoutvec[i], invec holding
// the lower ranks' partial result. reduce_into with src_first computes
// exactly op(src, dst), with lockstep's NaN, tie and wrapping rules.
template <ReduceOp kOp>
void run_kernel(void* invec, void* inoutvec, int* len, MPI_Datatype* type) {
  reduce_into(inoutvec, invec, static_cast<std::size_t>(*len), dtype_of(*type), kOp, /*src_first=*/true);
}

}  // namespace

MPI_Datatype reduction_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::f16:
    case DType::bf16: break;
  }
  LOCKSTEP_ENFORCE(false, "{} reaches MPI only widened to float", dtype);
  return MPI_DATATYPE_NULL;
}

ReductionOps::ReductionOps() {
  MPI_Op_create(&run_kernel<ReduceOp::min>, /*commute=*/0, &float_min_);
  MPI_Op_create(&run_kernel<ReduceOp::max>, /*commute=*/0, &float_max_);
  MPI_Op_create(&run_kernel<ReduceOp::sum>, /*commute=*/1, &wrapping_sum_);
  MPI_Op_create(&run_kernel<ReduceOp::prod>, /*commute=*/1, &wrapping_prod_);
}

ReductionOps::~ReductionOps() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!owned_ || finalized) return;
  for (MPI_Op* op : {&float_min_, &float_max_, &wrapping_sum_, &wrapping_prod_}) MPI_Op_free(op);
}

MPI_Op ReductionOps::get(DType dtype, ReduceOp op) const {
  const bool floating = is_floating(dtype);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: return floating ? MPI_SUM : wrapping_sum_;  // inputs multiplied first
    case ReduceOp::prod: return floating ? MPI_PROD : wrapping_prod_;
    case ReduceOp::min: return floating ? float_min_ : MPI_MIN;
    case ReduceOp::max: return floating ? float_max_ : MPI_MAX;
  }
  return MPI_OP_NULL;
}

ByteRange::ByteRange(std::size_t bytes, std::size_t max_count) {
  if (bytes <= max_count) {
    count_ = static_cast<int>(bytes);
    return;
  }
  // pieces x (max_count bytes), then the rest, as one struct of extent `bytes`.
  const std::size_t pieces = bytes / max_count;
  const std::size_t rest = bytes % max_count;
  LOCKSTEP_ENFORCE(pieces <= static_cast<std::size_t>(INT_MAX), "{} bytes is too large for one MPI call", bytes);
  MPI_Datatype piece = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL;
  MPI_Type_contiguous(static_cast<int>(max_count), MPI_BYTE, &piece);
  MPI_Type_contiguous(static_cast<int>(pieces), piece, &whole);
  int lengths[2] = {1, static_cast<int>(rest)};
  MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(pieces * max_count)};
  MPI_Datatype types[2] = {whole, MPI_BYTE};
  MPI_Type_create_struct(rest > 0 ? 2 : 1, lengths, displacements, types, &type_);
  MPI_Type_commit(&type_);
  MPI_Type_free(&whole);
  MPI_Type_free(&piece);
  count_ = 1;
  derived_ = true;
}

ByteRange::~ByteRange() {
  // Freeing a datatype that a pending operation uses is allowed: MPI keeps
  // it until that operation completes.
  if (derived_) MPI_Type_free(&type_);
}

std::size_t max_count(std::optional<std::size_t> configured) {
  if (!configured) return INT_MAX;
  if (*configured < 1 || *configured > static_cast<std::size_t>(INT_MAX))
    throw ConfigError(fmt::format("Config::mpi_max_count is {}; it must lie in 1..{} (as {} does)", *configured,
                                  INT_MAX, env::kMpiMaxCount));
  return *configured;
}

}  // namespace lockstep::mpi
