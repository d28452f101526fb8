// Widening into the accumulation type and finishing out of it; see
// accumulation.h.
#include "comm/accumulation.h"

#include <cstring>

#include "comm/reduce_kernels.h"

namespace lockstep {

void copy_to_accumulation_type(const void* src, std::size_t count, DType dtype, void* dst) {
  if (accumulation_dtype(dtype) != dtype)
    widen_to_f32(src, static_cast<float*>(dst), count, dtype);
  else if (count > 0 && dst != src)
    std::memcpy(dst, src, count * dtype_size(dtype));
}

Accumulation Accumulation::in_place(Buffer data, Scratch& scratch) {
  const DType acc_type = accumulation_dtype(data.dtype);
  if (acc_type == data.dtype) return Accumulation(static_cast<std::byte*>(data.data), acc_type, data.dtype);
  return copy_of(data, scratch);
}

Accumulation Accumulation::copy_of(ConstBuffer input, Scratch& scratch) {
  const DType acc_type = accumulation_dtype(input.dtype);
  std::byte* copy = scratch.get(input.count * dtype_size(acc_type));
  copy_to_accumulation_type(input.data, input.count, input.dtype, copy);
  return Accumulation(copy, acc_type, input.dtype);
}

void Accumulation::finish(std::size_t begin, std::size_t count, ReduceOp reduce_op, int ranks, void* out) const {
  std::byte* src = at(begin);
  if (reduce_op == ReduceOp::avg) divide_by(src, count, dtype_, ranks);
  if (widened())
    narrow_from_f32(reinterpret_cast<const float*>(src), out, count, result_dtype_);
  else if (count > 0 && out != src)
    std::memcpy(out, src, count * dtype_size(dtype_));
}

}  // namespace lockstep
