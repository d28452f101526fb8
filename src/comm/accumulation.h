// The one place a reducing collective takes its data into the type it is
// reduced in (fp32 for f16/bf16, so partial sums lose nothing; the type
// itself otherwise) and finishes results out of it: avg divides once, by
// the number of ranks, and 16-bit results are rounded once, at the end.
// tcp, hier and mpi all reduce through it, so every backend averages and
// rounds the same way (bitwise-identical results across backends for the
// same summation order).
//
// Values over caller-owned memory; not thread-safe.
#pragma once

#include <cstddef>

#include "comm/scratch.h"
#include "lockstep/types.h"

namespace lockstep {

class Accumulation {
 public:
  // `data` itself when its type needs no widening, else an fp32 copy in
  // `scratch`. Reducing in place then changes the caller's buffer.
  static Accumulation in_place(Buffer data, Scratch& scratch);
  // Always a copy in `scratch` (the input is const, or must stay as it is).
  static Accumulation copy_of(ConstBuffer input, Scratch& scratch);
  // Data already in `dtype`, the accumulation type of `result_dtype` (a
  // step that widened it itself).
  static Accumulation of_accumulated(void* data, DType dtype, DType result_dtype) {
    return Accumulation(static_cast<std::byte*>(data), dtype, result_dtype);
  }

  std::byte* data() const { return data_; }
  DType dtype() const { return dtype_; }
  // The caller's element type, which results are finished into.
  DType result_dtype() const { return result_dtype_; }
  bool widened() const { return dtype_ != result_dtype_; }
  std::byte* at(std::size_t element) const { return data_ + element * dtype_size(dtype_); }

  // Finishes `count` elements from `begin`: avg divides them by `ranks`,
  // then they are written to `out` in the caller's type (rounded once when
  // widened; copied unless `out` is where they already are).
  void finish(std::size_t begin, std::size_t count, ReduceOp reduce_op, int ranks, void* out) const;

 private:
  Accumulation(std::byte* data, DType dtype, DType result_dtype)
      : data_(data), dtype_(dtype), result_dtype_(result_dtype) {}
  std::byte* data_;
  DType dtype_;
  DType result_dtype_;
};

// Writes `count` elements of `dtype` at `src` to `dst` in their
// accumulation type (widened, or copied as they are).
void copy_to_accumulation_type(const void* src, std::size_t count, DType dtype, void* dst);

}  // namespace lockstep
