// lockstep's dtypes and reduction ops as MPI datatypes and MPI_Ops, and byte
// ranges of any length as MPI (count, datatype) pairs.
//
//   float sum, prod, avg    MPI_FLOAT / MPI_DOUBLE with MPI_SUM / MPI_PROD
//   float min, max          user-defined ops: MPI_MIN/MAX are undefined on
//                           NaN (Open MPI's drop it), lockstep's propagate it
//   integer sum, prod, avg  user-defined ops: lockstep's integer sums and
//                           products wrap, and MPI leaves overflow undefined
//                           (Open MPI's vectorised MPI_SUM saturates 8-bit
//                           sums instead: 200 + 100 gives 255, not 44; its
//                           issue #8045 was closed as "won't fix")
//   integer min, max        MPI_MIN / MPI_MAX (no overflow possible)
//   f16, bf16               never reach MPI: they are widened to fp32 first
//
// The user-defined ops run lockstep's own kernels (reduce_kernels.h).
// ReductionOps is owned by one backend; the rest are values. Thread-safe.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <optional>

#include "lockstep/types.h"

namespace lockstep::mpi {

// The MPI datatype of `dtype`'s elements (not f16/bf16).
MPI_Datatype reduction_type(DType dtype);

// The MPI_Ops lockstep defines (see the table above), created per backend.
//
// Float min and max are non-commutative ops. That makes MPI combine operands
// in rank order ("invec op inoutvec", invec from the lower ranks), the order
// the other backends use, and with lockstep's kernels (a NaN operand wins,
// the first one if both are; of equal operands, such as -0 and +0, the
// first wins) the result is the earliest NaN or the earliest extreme value
// in rank order, whatever grouping MPI's algorithm chooses. Every rank thus
// gets the same bits, the other backends' bits, NaN payloads and zero signs
// included.
//
// Integer sum and prod are commutative ops: wrapping addition and
// multiplication modulo 2^bits are exactly commutative and associative, so
// any order and grouping gives the same bits.
class ReductionOps {
 public:
  ReductionOps();
  ~ReductionOps();
  ReductionOps(const ReductionOps&) = delete;
  ReductionOps& operator=(const ReductionOps&) = delete;

  // The MPI_Op for reducing `dtype` (not f16/bf16) with `op`.
  MPI_Op get(DType dtype, ReduceOp op) const;
  // Do not free the ops: an operation that timed out may still use them.
  void leak() { owned_ = false; }

 private:
  MPI_Op float_min_ = MPI_OP_NULL;
  MPI_Op float_max_ = MPI_OP_NULL;
  MPI_Op wrapping_sum_ = MPI_OP_NULL;
  MPI_Op wrapping_prod_ = MPI_OP_NULL;
  bool owned_ = true;
};

// `bytes` bytes as an MPI (count, datatype) pair. MPI counts are int; a
// range longer than `max_count` bytes is described by a derived datatype
// (whole pieces of max_count bytes plus the rest) whose extent is the whole
// range, so it also works as the block size of an allgather.
class ByteRange {
 public:
  ByteRange(std::size_t bytes, std::size_t max_count);
  ~ByteRange();
  ByteRange(const ByteRange&) = delete;
  ByteRange& operator=(const ByteRange&) = delete;

  int count() const { return count_; }
  MPI_Datatype type() const { return type_; }

 private:
  int count_ = 0;
  MPI_Datatype type_ = MPI_BYTE;
  bool derived_ = false;
};

// The largest element count one MPI call takes: INT_MAX, unless
// `configured` (Config::mpi_max_count, LOCKSTEP_MPI_MAX_COUNT) lowers it.
std::size_t max_count(std::optional<std::size_t> configured);

// Calls fn(first, count) for consecutive pieces of [0, total) of at most
// `max_count` elements; nothing for total 0.
template <typename Fn>
void for_each_piece(std::size_t total, std::size_t max_count, Fn&& fn) {
  for (std::size_t first = 0; first < total; first += max_count)
    fn(first, total - first < max_count ? total - first : max_count);
}

}  // namespace lockstep::mpi
